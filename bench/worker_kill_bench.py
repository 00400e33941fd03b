"""What clients see when a gateway worker process is killed while many connections arrive.

Starts `shoal serve` ([s3] workers = 2, embedded PostgreSQL, in a temporary folder), then
`--clients` threads that each send unsigned requests (answered 403 by the gateway: a whole
request, cheap) on a new connection every time, for `--seconds`; a third of the way in, the
worker process is killed with SIGKILL (serve starts another). Prints how many requests
failed and how slow they were in the seconds after the kill: a connection the kernel drops
from a full accept queue is retried by the client a second or more later, so requests of
1 s and more are the mark of a backlog too short.

    python bench/worker_kill_bench.py [--clients 200] [--seconds 9]
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import threading
import time

import psutil
from s3_bench import started_shoal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=9.0)
    args = parser.parse_args()
    gc_off = "\n[gc]\nenabled = false\n"
    with started_shoal("shoal-worker-kill-", gateway_workers=2, settings=gc_off) as server:
        assert server.gateway_pid is not None
        port = int(server.endpoint.rsplit(":", 1)[1])
        run(port, server.gateway_pid, args.clients, args.seconds)


def run(port: int, serve_pid: int, clients: int, seconds: float) -> None:
    (worker,) = [
        p
        for p in psutil.Process(serve_pid).children()
        if "multiprocessing.spawn" in " ".join(p.cmdline())
    ]
    outcomes: list[tuple[float, float, bool]] = []  # (start, seconds, answered)
    lock = threading.Lock()
    started = time.monotonic()
    end = started + seconds

    def client() -> None:
        while time.monotonic() < end:
            begin = time.monotonic()
            answered = True
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                connection.request("GET", "/", headers={"Connection": "close"})
                connection.getresponse().read()
                connection.close()
            except OSError:
                answered = False
            with lock:
                outcomes.append((begin, time.monotonic() - begin, answered))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 3)
    killed_at = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    for thread in threads:
        thread.join()
    before = [o for o in outcomes if o[0] < killed_at - 1]
    after = [o for o in outcomes if killed_at - 1 <= o[0] < killed_at + 3]
    print(f"{clients} clients, {len(outcomes)} requests, worker killed at {seconds / 3:.1f} s")
    for label, group in (("before the kill", before), ("from 1 s before to 3 s after", after)):
        times = sorted(o[1] for o in group)
        failed = sum(1 for o in group if not o[2])
        slow = sum(1 for t in times if t >= 1.0)
        p99 = times[int(len(times) * 0.99)] if times else 0.0
        print(
            f"  {label:30} {len(group):6} requests, {failed} failed, {slow} took >= 1 s, "
            f"p99 {p99 * 1000:.0f} ms, max {times[-1] * 1000 if times else 0:.0f} ms"
        )


if __name__ == "__main__":
    main()
