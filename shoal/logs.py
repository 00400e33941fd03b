"""How every Shoal process logs: one line per record on stderr, the same in every process."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The access log writes a line per request: those go out in batches (see BatchedLines).
ACCESS_LOGGER = "shoal.access"


def configure() -> None:
    """Shoal's own INFO lines (the access log among them); only warnings from libraries."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT, stream=sys.stderr)
    logging.getLogger("shoal").setLevel(logging.INFO)
    access = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(h, BatchedLines) for h in access.handlers):
        batched = BatchedLines(sys.stderr)
        batched.setFormatter(logging.Formatter(FORMAT))
        access.addHandler(batched)
        access.propagate = False


class BatchedLines(logging.StreamHandler):  # type: ignore[type-arg]
    """Lines written to the stream in batches, at most FLUSH_SECONDS after they were logged.

    For loggers with a line per request: one write per line was ~2% of a gateway's CPU under
    load. The event loop of the thread that logs writes them out later; a line logged where
    no loop runs is written at once. Lines still held are written when logging shuts down
    (at exit); a process killed with SIGKILL loses at most FLUSH_SECONDS of them.
    """

    FLUSH_SECONDS = 0.2

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Called under self.lock (Handler.handle takes it; an RLock, so flush may take it too).
        try:
            self._held.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)
            return
        if len(self._held) == 1:  # the first line held: have it written out soon
            try:
                asyncio.get_running_loop().call_later(self.FLUSH_SECONDS, self.flush)
            except RuntimeError:  # no event loop here to do it later
                self.flush()

    def flush(self) -> None:
        with self.lock:
            if self._held:
                lines, self._held = "".join(self._held), []
                try:
                    self.stream.write(lines)
                except Exception:  # a closed stderr must not break requests
                    return
            super().flush()
