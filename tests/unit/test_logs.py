"""The access log: lines as the logging format writes them, held on an event loop and
written out soon after; at once elsewhere; none when its logger is above INFO."""

from __future__ import annotations

import asyncio
import io
import logging
import re
from collections.abc import Iterator

import pytest

from shoal.logs import ACCESS_LOGGER, FORMAT, AccessLog


@pytest.fixture(autouse=True)
def access_logger_at_info() -> Iterator[logging.Logger]:
    """As shoal.logs.configure() leaves it in every Shoal process."""
    logger = logging.getLogger(ACCESS_LOGGER)
    before = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(before)


LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO shoal\.access (.*)\n")


def test_lines_logged_where_no_loop_runs_are_written_at_once() -> None:
    stream = io.StringIO()
    AccessLog(stream).line("one")
    found = LINE.fullmatch(stream.getvalue())
    assert found is not None and found[1] == "one"


def test_lines_look_like_the_logging_format() -> None:
    stream, ours = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "same", None, None)
    handler.handle(record)
    AccessLog(ours).line("same")
    # The same but for the time, a moment later.
    theirs = stream.getvalue()
    assert LINE.fullmatch(theirs) is not None and LINE.fullmatch(ours.getvalue()) is not None
    assert theirs[23:] == ours.getvalue()[23:]
    assert theirs[:23] <= ours.getvalue()[:23]


def test_lines_logged_on_a_loop_are_written_together_soon_after() -> None:
    stream = io.StringIO()
    log = AccessLog(stream)

    async def requests() -> tuple[str, str]:
        log.line("first")
        log.line("second")
        held = stream.getvalue()
        await asyncio.sleep(AccessLog.FLUSH_SECONDS * 2)
        return held, stream.getvalue()

    held, written = asyncio.run(requests())
    assert held == ""
    assert [m[1] for m in LINE.finditer(written)] == ["first", "second"]


def test_no_lines_when_the_access_logger_is_above_info(
    access_logger_at_info: logging.Logger,
) -> None:
    stream = io.StringIO()
    access_logger_at_info.setLevel(logging.WARNING)
    AccessLog(stream).line("quiet")
    assert stream.getvalue() == ""
