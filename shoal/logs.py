"""How every Shoal process logs: one line per record on stderr, the same in every process."""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import time
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACCESS_LOGGER = "shoal.access"


def configure() -> None:
    """Shoal's own INFO lines (the access log among them); only warnings from libraries."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT, stream=sys.stderr)
    logging.getLogger("shoal").setLevel(logging.INFO)


class AccessLog:
    """The gateway's line per request, as FORMAT would write it for the `shoal.access`
    logger, written out in batches at most FLUSH_SECONDS after they were logged.

    Not through a logging.Handler: the logging module's work per record (a LogRecord, a walk
    up the stack for the caller, a Formatter) cost about ten times what this does, a few
    percent of a 4 KiB GET (docs/decisions.md, "The access log written by the gateway";
    `bench/gateway_instructions.py get`). The logger's level still decides (`shoal.access`
    above INFO: no lines). One write per line was a measurable share of a gateway's CPU under
    load, hence batches. The event loop of
    the thread that logs writes them out later; a line logged where no loop runs is written
    at once. Lines still held are written at exit; a process killed with SIGKILL loses at
    most FLUSH_SECONDS of them.
    """

    FLUSH_SECONDS = 0.2

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream  # None: sys.stderr as it is at the time of writing
        self._logger = logging.getLogger(ACCESS_LOGGER)
        self._held: list[str] = []
        self._second = -1
        self._second_text = ""
        atexit.register(self.flush)

    def line(self, message: str) -> None:
        if not self._logger.isEnabledFor(logging.INFO):
            return
        self._held.append(f"{self._timestamp()} INFO {ACCESS_LOGGER} {message}\n")
        if len(self._held) == 1:  # the first line held: have it written out soon
            try:
                asyncio.get_running_loop().call_later(self.FLUSH_SECONDS, self.flush)
            except RuntimeError:  # no event loop here to do it later
                self.flush()

    def flush(self) -> None:
        if not self._held:
            return
        lines, self._held = "".join(self._held), []
        stream = self._stream or sys.stderr
        try:
            stream.write(lines)
            stream.flush()
        except (OSError, ValueError):  # a closed stderr must not break requests
            pass

    def _timestamp(self) -> str:
        """logging's asctime (local time, milliseconds after a comma), its seconds kept."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._second_text},{int((now - second) * 1000):03d}"
