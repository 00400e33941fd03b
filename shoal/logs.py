"""How every Shoal process logs: one line per record on stderr, the same in every process.

Two formats (`[log] format`): "text", for people, and "json", one JSON object a line for log
shippers, with at least `time` (ISO 8601, UTC, milliseconds), `level`, `logger` and
`message`, `exc` when a traceback comes with the record, and the access line's fields on
access lines. A process configures its format once at start (configure); worker processes
are handed their parent's (shoal.workers).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import sys
import threading
import time
from json.encoder import encode_basestring_ascii as json_string
from types import TracebackType
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACCESS_LOGGER = "shoal.access"
FORMATS = ("text", "json")

_format = "text"


def configure(log_format: str = "text") -> None:
    """Shoal's own INFO lines (the access log among them); only warnings from libraries;
    all of them in `log_format` on stderr.

    A handler someone else put on the root logger (a test runner's, say) is left alone, and
    then none is added; calling this again replaces the handler it added before.
    """
    global _format
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    _format = log_format
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ShoalHandler)]:
        root.removeHandler(handler)
    if not root.handlers:
        handler = _ShoalHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    logging.getLogger("shoal").setLevel(logging.INFO)
    if log_format == "json":
        # What Python would otherwise write on stderr itself, as text: warnings and the
        # tracebacks of uncaught exceptions.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def current_format() -> str:
    """The format this process logs in (for the workers it starts)."""
    return _format


class _ShoalHandler(logging.StreamHandler[TextIO]):
    """The stderr handler configure() adds (and replaces when called again)."""


def iso_time(seconds: float) -> str:
    """`seconds` since the epoch as ISO 8601 in UTC with milliseconds: YYYY-MM-DDTHH:MM:SS.mmmZ"""
    whole = int(seconds)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{_millis(seconds)}Z"


def _millis(seconds: float) -> str:
    return f"{min(999, int((seconds - int(seconds)) * 1000)):03d}"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line (a traceback included, escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, separators=(",", ":"))  # as the access lines have it


def _log_uncaught(
    kind: type[BaseException], value: BaseException, traceback: TracebackType | None
) -> None:
    logging.getLogger("shoal").critical("uncaught exception", exc_info=(kind, value, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    logging.getLogger("shoal").critical(
        "uncaught exception in thread %s",
        args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


class AccessLog:
    """The gateway's line per request, as the configured format writes a record of the
    `shoal.access` logger, written out in batches at most FLUSH_SECONDS after they were
    logged.

    Not through a logging.Handler: the logging module's work per record (a LogRecord, a walk
    up the stack for the caller, a Formatter) cost about ten times what this does, a few
    percent of a 4 KiB GET (docs/decisions.md, "The access log written by the gateway";
    `bench/gateway_instructions.py get`; bench/access_log_bench.py measures the text and JSON
    formats). The logger's level still decides (`shoal.access` above INFO: no lines). One
    write per line was a measurable share of a gateway's CPU under load, hence batches. The
    event loop of the thread that logs writes them out later; a line logged where no loop
    runs is written at once. Lines still held are written at exit; a process killed with
    SIGKILL loses at most FLUSH_SECONDS of them.
    """

    FLUSH_SECONDS = 0.2

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream  # None: sys.stderr as it is at the time of writing
        self._logger = logging.getLogger(ACCESS_LOGGER)
        self._held: list[str] = []
        self._second = -1
        self._second_text = ""
        self._second_format = ""
        atexit.register(self.flush)

    def request(
        self,
        request_id: str,
        account: str,
        operation: str,
        status: int | None,
        bytes_in: int,
        bytes_out: int,
        seconds: float,
        cut: bool,
    ) -> None:
        """One request's line. `status` None: no answer was sent; `cut`: the answer was cut
        short (the client left, or an error after the head)."""
        if not self._logger.isEnabledFor(logging.INFO):
            return
        milliseconds = seconds * 1000
        shown_status = "-" if status is None else status
        message = (
            f"{request_id} account={account} op={operation} status={shown_status} "
            f"bytes_in={bytes_in} bytes_out={bytes_out} ms={milliseconds:.1f}"
            f"{' cut' if cut else ''}"
        )
        if _format == "text":
            self._hold(f"{self._timestamp()} INFO {ACCESS_LOGGER} {message}\n")
            return
        # Written out by hand: json.dumps of the same dict cost about twice as much.
        self._hold(
            f'{{"time":"{self._timestamp()}Z","level":"INFO","logger":"{ACCESS_LOGGER}",'
            f'"message":{json_string(message)},"request_id":{json_string(request_id)},'
            f'"account":{json_string(account)},"operation":{json_string(operation)},'
            f'"status":{"null" if status is None else int(status)},'
            f'"bytes_in":{int(bytes_in)},"bytes_out":{int(bytes_out)},'
            f'"duration_ms":{milliseconds:.1f},"cut":{"true" if cut else "false"}}}\n'
        )

    def _hold(self, line: str) -> None:
        self._held.append(line)
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
        """As the format's records have it: logging's asctime (local time, milliseconds after
        a comma), or iso_time but its Z; the text of the second kept."""
        now = time.time()
        second = int(now)
        if second != self._second or _format != self._second_format:
            self._second, self._second_format = second, _format
            if _format == "json":
                self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
            else:
                self._second_text = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(second))
        return f"{self._second_text}{int((now - second) * 1000):03d}"
