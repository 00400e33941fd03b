"""The logs: the access log's lines as the logging format writes them, held on an event loop
and written out soon after; at once elsewhere; none when its logger is above INFO. In the
JSON format, every line one object."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime

import pytest

import shoal.logs
from shoal.logs import ACCESS_LOGGER, FORMAT, AccessLog, JsonFormatter


@pytest.fixture(autouse=True)
def access_logger_at_info() -> Iterator[logging.Logger]:
    """As shoal.logs.configure() leaves it in every Shoal process."""
    logger = logging.getLogger(ACCESS_LOGGER)
    before = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(before)


@pytest.fixture
def json_format() -> Iterator[None]:
    """The JSON format for this test (only the module's setting: no handler is touched)."""
    before = shoal.logs._format
    shoal.logs._format = "json"
    yield
    shoal.logs._format = before


LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO shoal\.access (.*)\n")


def one_request(log: AccessLog, request_id: str = "R1", status: int | None = 200) -> None:
    log.request(request_id, "acct", "GetObject", status, 5, 4096, 0.0123, cut=False)


def test_lines_logged_where_no_loop_runs_are_written_at_once() -> None:
    stream = io.StringIO()
    one_request(AccessLog(stream))
    found = LINE.fullmatch(stream.getvalue())
    assert found is not None
    assert found[1] == "R1 account=acct op=GetObject status=200 bytes_in=5 bytes_out=4096 ms=12.3"


def test_a_request_without_an_answer_or_cut_short_says_so() -> None:
    stream = io.StringIO()
    AccessLog(stream).request("R2", "-", "-", None, 0, 10, 0.001, cut=True)
    assert stream.getvalue().endswith(
        " R2 account=- op=- status=- bytes_in=0 bytes_out=10 ms=1.0 cut\n"
    )


def test_lines_look_like_the_logging_format() -> None:
    stream, ours = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    message = "R1 account=acct op=GetObject status=200 bytes_in=5 bytes_out=4096 ms=12.3"
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, message, None, None)
    handler.handle(record)
    one_request(AccessLog(ours))
    # The same but for the time, a moment later.
    theirs = stream.getvalue()
    assert LINE.fullmatch(theirs) is not None and LINE.fullmatch(ours.getvalue()) is not None
    assert theirs[23:] == ours.getvalue()[23:]
    assert theirs[:23] <= ours.getvalue()[:23]


def test_lines_logged_on_a_loop_are_written_together_soon_after() -> None:
    stream = io.StringIO()
    log = AccessLog(stream)

    async def requests() -> tuple[str, str]:
        one_request(log, "first")
        one_request(log, "second")
        held = stream.getvalue()
        await asyncio.sleep(AccessLog.FLUSH_SECONDS * 2)
        return held, stream.getvalue()

    held, written = asyncio.run(requests())
    assert held == ""
    assert [m[1].split()[0] for m in LINE.finditer(written)] == ["first", "second"]


def test_no_lines_when_the_access_logger_is_above_info(
    access_logger_at_info: logging.Logger,
) -> None:
    stream = io.StringIO()
    access_logger_at_info.setLevel(logging.WARNING)
    one_request(AccessLog(stream))
    assert stream.getvalue() == ""


def test_json_access_lines_are_one_object_with_the_fields(json_format: None) -> None:
    stream = io.StringIO()
    log = AccessLog(stream)
    one_request(log)
    log.request('R"3\\', "anonymous", "PutObject", None, 7, 0, 2.5, cut=True)
    first, second = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert first == {
        "time": first["time"],
        "level": "INFO",
        "logger": ACCESS_LOGGER,
        "message": "R1 account=acct op=GetObject status=200 bytes_in=5 bytes_out=4096 ms=12.3",
        "request_id": "R1",
        "account": "acct",
        "operation": "GetObject",
        "status": 200,
        "bytes_in": 5,
        "bytes_out": 4096,
        "duration_ms": 12.3,
        "cut": False,
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert datetime.fromisoformat(first["time"]).utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert second["request_id"] == 'R"3\\' and second["status"] is None and second["cut"] is True


def test_json_records_carry_time_level_logger_message_and_the_traceback() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError as exc:
        record = logging.LogRecord(
            "shoal.x", logging.ERROR, __file__, 1, "failed: %s", (exc,), (type(exc), exc, None)
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and entry["logger"] == "shoal.x"
    assert entry["message"] == "failed: bad\nthing"
    assert "ValueError: bad" in entry["exc"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
