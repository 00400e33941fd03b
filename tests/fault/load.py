"""A bounded, concurrent, mixed S3 load for fault tests, and the ledger that checks it.

Each thread owns its own keys, so what a key should hold follows from that thread's own
history: the last acknowledged PUT, or nothing after an acknowledged DELETE. A request that
failed (an error status, a broken connection, a time-out) may or may not have happened, so
after it the key may hold any of the values it could have had since its last certain state.
`verify` reads every key back and fails on anything else: an acknowledged write lost or
changed, or a value nobody wrote.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions

# Sizes that take each path: inline in the row, one block, several blocks.
SIZES = (1024, 64 * 1024, 1536 * 1024)
GONE = "gone"  # the state of a key that was deleted, or never written


@dataclass
class Outcome:
    """One request as the client saw it."""

    op: str
    key: str
    started: float  # time.monotonic()
    seconds: float
    status: int | None  # HTTP status, None for a connection error or time-out
    error: str = ""  # the exception, when there was one

    @property
    def failed(self) -> bool:
        return self.status is None or self.status >= 300


@dataclass
class _KeyState:
    """What a key may hold: digests of possible contents, or GONE."""

    possible: set[str] = field(default_factory=lambda: {GONE})

    def certain(self, state: str) -> None:
        self.possible = {state}

    def maybe(self, state: str) -> None:
        self.possible.add(state)


class MixedLoad:
    """`threads` clients doing PUT, GET and DELETE on their own keys until stopped, at most
    `max_requests` each and never past `max_seconds`. `make_client(**botocore_config)` makes
    a boto3 client with that configuration (Served.raw_client does); the load asks it for no
    retries, so that each outcome is the answer to one request."""

    def __init__(
        self,
        make_client: Callable[..., Any],
        bucket: str,
        threads: int = 4,
        max_requests: int = 400,
        max_seconds: float = 60.0,
        keys_per_thread: int = 12,
        seed: int = 7,
        pause_after_failure: float = 0.05,
    ) -> None:
        self.make_client = make_client
        self.bucket = bucket
        self.threads = threads
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.keys_per_thread = keys_per_thread
        self.seed = seed
        # A client that was refused waits a little, as one would: an outage of a few seconds
        # then spends tens of requests of `max_requests`, not hundreds.
        self.pause_after_failure = pause_after_failure
        self.outcomes: list[Outcome] = []
        self.keys: dict[str, _KeyState] = {}
        self.violations: list[str] = []  # reads that saw what the key may not hold
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def start(self) -> MixedLoad:
        # Twice would run two threads on each thread's keys, and the ledger would be wrong.
        assert not self._workers, "the load was started already (`with load:` starts it)"
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(self.max_seconds + 30)
        assert not any(w.is_alive() for w in self._workers), "a load thread did not stop"

    def __enter__(self) -> MixedLoad:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def acknowledged_writes(self) -> int:
        return sum(1 for o in self.outcomes if o.op == "PUT" and not o.failed)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed and not _expected_miss(o)]

    def failures_between(self, start: float, end: float) -> list[Outcome]:
        return [o for o in self.failures() if start <= o.started <= end]

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> None:
        """Until `count` more requests have been answered (the load is really running)."""
        target = len(self.outcomes) + count
        deadline = time.monotonic() + timeout
        while len(self.outcomes) < target:
            assert time.monotonic() < deadline, "the load made no progress"
            time.sleep(0.05)

    def verify(self, client: Any) -> None:
        """Every read during the load and every key now held a value it may hold; raise
        AssertionError otherwise."""
        wrong = list(self.violations)
        for key, state in sorted(self.keys.items()):
            status, found, error = _get(client, self.bucket, key)
            assert status in (200, 404), f"reading {key} back failed: {status} {error}"
            if found not in state.possible:
                wrong.append(f"{key}: found {found}, expected one of {sorted(state.possible)}")
        assert not wrong, "acknowledged data lost or changed:\n" + "\n".join(wrong)

    def verify_listings(self, client: Any) -> None:
        """The '/' listings (from the metadata tier's directory) agree with the keys there
        are: each thread's folder is a common prefix of the root exactly when it holds a
        key, and its listing holds exactly its keys. Raise AssertionError otherwise."""
        keys = _all_keys(client, self.bucket, prefix="")
        folders = sorted({key[: key.index("/") + 1] for key in keys})
        root = client.list_objects_v2(Bucket=self.bucket, Delimiter="/")
        listed = [p["Prefix"] for p in root.get("CommonPrefixes", [])]
        assert listed == folders, f"'/' listing of the root: {listed}, keys under {folders}"
        for folder in folders:
            page = client.list_objects_v2(Bucket=self.bucket, Prefix=folder, Delimiter="/")
            names = [o["Key"] for o in page.get("Contents", [])]
            assert names == [k for k in keys if k.startswith(folder)], folder

    def _run(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        # No retries: each request's fate is recorded as the client first saw it. A request
        # may take long on a loaded machine without failing (the tests that bound an answer's
        # time check `Outcome.seconds`), and still ends before `stop` gives up on the thread.
        client = self.make_client(
            connect_timeout=5, read_timeout=25, retries={"total_max_attempts": 1}
        )
        keys = [f"load-{index}/{n:03d}" for n in range(self.keys_per_thread)]
        with self._lock:
            for key in keys:
                self.keys.setdefault(key, _KeyState())
        deadline = time.monotonic() + self.max_seconds
        try:
            for _ in range(self.max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                self._one_request(client, rng, rng.choice(keys))
        finally:
            client.close()

    def _one_request(self, client: Any, rng: random.Random, key: str) -> None:
        state = self.keys[key]
        op = rng.choices(("PUT", "GET", "DELETE"), weights=(5, 4, 1))[0]
        started = time.monotonic()
        status, error = None, ""
        if op == "PUT":
            body = rng.randbytes(rng.choice(SIZES))
            digest = hashlib.md5(body).hexdigest()
            status, error = _call(lambda: client.put_object(Bucket=self.bucket, Key=key, Body=body))
            (state.certain if status == 200 else state.maybe)(digest)
        elif op == "DELETE":
            status, error = _call(lambda: client.delete_object(Bucket=self.bucket, Key=key))
            (state.certain if status == 204 else state.maybe)(GONE)
        else:
            status, found, error = _get(client, self.bucket, key)
            if found and found not in state.possible:
                with self._lock:
                    self.violations.append(f"GET {key} read {found}, not a value it may hold")
        outcome = Outcome(op, key, started, time.monotonic() - started, status, error)
        with self._lock:
            self.outcomes.append(outcome)
        if outcome.failed and not _expected_miss(outcome):
            time.sleep(self.pause_after_failure)


def _get(client: Any, bucket: str, key: str) -> tuple[int | None, str, str]:
    """A GET read to its end: its status, what it found (a digest, or GONE), its error."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except botocore.exceptions.ClientError as exc:
        status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        return status, GONE if status == 404 else "", repr(exc)
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        return None, "", repr(exc)
    return 200, hashlib.md5(body).hexdigest(), ""


def _call(request: Callable[[], dict[str, Any]]) -> tuple[int | None, str]:
    """The HTTP status of a request (None if it got none) and its error."""
    try:
        response = request()
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"]), repr(exc)
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        return None, repr(exc)
    return int(response["ResponseMetadata"]["HTTPStatusCode"]), ""


def _expected_miss(outcome: Outcome) -> bool:
    """A GET of a key that is not there is an answer, not a failure."""
    return outcome.op == "GET" and outcome.status == 404


def statuses(outcomes: list[Outcome]) -> dict[int | None, int]:
    """How many outcomes had each status (None: connection errors), for messages."""
    counts: dict[int | None, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return counts


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
    """Seconds until `check()` is true; AssertionError after `timeout`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not true within {timeout} s"
        time.sleep(interval)
    return time.monotonic() - started


def iter_failures(load: MixedLoad) -> Iterator[str]:
    for outcome in load.failures():
        yield f"{outcome.op} {outcome.key} -> {outcome.status} {outcome.error[:200]}"


def _all_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys
