"""What one access line costs the gateway, in the text and the JSON log format.

    .venv/bin/python bench/access_log_bench.py            # a few seconds
    .venv/bin/python bench/access_log_bench.py --quick    # a smoke run

Why: the gateway writes a line per request (shoal/logs.py AccessLog), so its cost is paid by
every GET of a small object. `[log] format = "json"` must not make it a cost to weigh.

What is measured, in this process, on one core, on an event loop (lines held and written out
in batches of a thousand to a StringIO, as the loop writes them out to stderr):

  text                  AccessLog.request with the text format (the default)
  json                  AccessLog.request with the JSON format (written out by hand)
  json.dumps, for scale the same JSON object made by json.dumps of a dict
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import time
from collections.abc import Callable

from benchlib import per_call

import shoal.logs
from shoal.logs import ACCESS_LOGGER, AccessLog

ACCOUNT = "4f9c1d2e-7a1b-4c3d-9e8f-0a1b2c3d4e5f"


def access_line(log: AccessLog) -> Callable[[], None]:
    stream = io.StringIO()
    log._stream = stream

    def line() -> None:
        log.request("0A1B2C3D00000001", ACCOUNT, "GetObject", 200, 0, 4096, 0.00123, cut=False)
        if len(log._held) >= 1000:
            log.flush()
            stream.seek(0)
            stream.truncate()

    return line


def dumped() -> str:
    return json.dumps(
        {
            "time": shoal.logs.iso_time(time.time()),
            "level": "INFO",
            "logger": ACCESS_LOGGER,
            "message": f"0A1B2C3D00000001 account={ACCOUNT} op=GetObject status=200 "
            f"bytes_in=0 bytes_out=4096 ms={1.23:.1f}",
            "request_id": "0A1B2C3D00000001",
            "account": ACCOUNT,
            "operation": "GetObject",
            "status": 200,
            "bytes_in": 0,
            "bytes_out": 4096,
            "duration_ms": round(1.23, 1),
            "cut": False,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    count = 2_000 if parser.parse_args().quick else 200_000
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)
    figures = {}

    async def on_a_loop(log_format: str) -> float:
        shoal.logs._format = log_format  # the module's setting only: no handler is touched
        return per_call(access_line(AccessLog()), count)

    for log_format in shoal.logs.FORMATS:
        figures[log_format] = asyncio.run(on_a_loop(log_format))
    figures["json.dumps, for scale"] = per_call(dumped, count)
    shoal.logs._format = "text"
    for name, seconds in figures.items():
        print(f"{name:<24} {seconds * 1e6:6.2f} us a line")


if __name__ == "__main__":
    main()
