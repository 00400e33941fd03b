"""The bucket incarnations a process has looked up, kept for a second, and forgotten as soon
as any process deletes the bucket.

Object calls name a bucket; the rows they touch are keyed by the bucket's incarnation id, which
lives on another vnode (often another shard). Reading it on every call costs a round trip of
two. A cached id goes stale when the bucket is deleted (and perhaps created again under the
same name): a write would then land in the dead incarnation, acknowledged but invisible, and
GC would reclaim it. So a deletion is broadcast: Buckets.delete releases the name on the
catalog shard with NOTIFY (queries.RELEASE_BUCKET_NAME), PostgreSQL delivers it when the
deletion commits, and every process LISTENing drops the entry before its client can have seen
the delete's response. Entries are trusted only while that LISTEN connection is up; it is
reopened when it breaks, and the cache starts empty again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import psycopg

from shoal.metadata.models import Bucket

log = logging.getLogger("shoal.metadata")

CHANNEL = "shoal_bucket_gone"
# A safety net for a notification that never comes (a process of an older version deleting).
KEEP_SECONDS = 1.0
RECONNECT_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 2


class BucketCache:
    def __init__(self, catalog_dsn: str) -> None:
        self.catalog_dsn = catalog_dsn
        self._entries: dict[tuple[uuid.UUID, str], tuple[float, Bucket]] = {}
        self._listening = False
        self._watcher: asyncio.Task[None] | None = None

    def get(self, owner: uuid.UUID, name: str) -> Bucket | None:
        entry = self._entries.get((owner, name))
        if entry is None or time.monotonic() >= entry[0]:
            return None
        return entry[1]

    def keep(self, owner: uuid.UUID, name: str, bucket: Bucket) -> None:
        if self._listening:
            self._entries[(owner, name)] = (time.monotonic() + KEEP_SECONDS, bucket)

    def forget(self, owner: uuid.UUID, name: str) -> None:
        self._entries.pop((owner, name), None)

    async def start(self) -> None:
        """Start listening for deletions (the cache keeps nothing until it listens)."""
        connected = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch(connected))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(connected.wait(), 10)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._stop_trusting()

    async def _watch(self, connected: asyncio.Event) -> None:
        warned = False  # once per outage, not once a second
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.catalog_dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listening = True
                    warned = False
                    connected.set()
                    async for notice in conn.notifies():
                        self._forget_payload(notice.payload)
            except psycopg.Error as exc:
                if not warned:
                    log.warning("bucket cache off, no deletion notices: %s", exc)
                    warned = True
            finally:
                self._stop_trusting()
            await asyncio.sleep(RECONNECT_SECONDS)

    def _forget_payload(self, payload: str) -> None:
        owner, _, name = payload.partition("/")
        with contextlib.suppress(ValueError):
            self.forget(uuid.UUID(owner), name)

    def _stop_trusting(self) -> None:
        self._listening = False
        self._entries.clear()
