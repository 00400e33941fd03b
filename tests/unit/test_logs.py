"""The batched access log: held on an event loop, written out soon after; at once elsewhere."""

from __future__ import annotations

import asyncio
import io
import logging

from shoal.logs import BatchedLines


def logger_into(stream: io.StringIO, name: str) -> logging.Logger:
    handler = BatchedLines(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_lines_logged_where_no_loop_runs_are_written_at_once() -> None:
    stream = io.StringIO()
    logger_into(stream, "test.logs.direct").info("one")
    assert stream.getvalue() == "one\n"


def test_lines_logged_on_a_loop_are_written_together_soon_after() -> None:
    stream = io.StringIO()
    logger = logger_into(stream, "test.logs.batched")

    async def requests() -> tuple[str, str]:
        logger.info("first")
        logger.info("second")
        held = stream.getvalue()
        await asyncio.sleep(BatchedLines.FLUSH_SECONDS * 2)
        return held, stream.getvalue()

    held, written = asyncio.run(requests())
    assert held == ""
    assert written == "first\nsecond\n"
