"""The metadata API: one object for the gateway, the GC daemon, the pipeline and the CLI.

store = await MetadataStore.open(shard_configs)
account = await store.accounts.create("alice")
await store.buckets.create(account.id, "photos")
await store.objects.put(account.id, "photos", "cat.jpg", ObjectWrite(...))
page = await store.objects.list(account.id, "photos", prefix="2024/", delimiter="/")
await store.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType

from shoal.config import ShardConfig
from shoal.metadata.accounts import Accounts
from shoal.metadata.buckets import Buckets
from shoal.metadata.claims import BucketClaims
from shoal.metadata.garbage import Garbage, GarbageBook
from shoal.metadata.inventories import Inventories
from shoal.metadata.keys import Keys
from shoal.metadata.nodes import Nodes
from shoal.metadata.objects import Objects
from shoal.metadata.partitions import ensure_windows, window_width
from shoal.metadata.pipeline_runs import PipelineBook
from shoal.metadata.replicas import UnderReplicated
from shoal.metadata.ring import Ring
from shoal.metadata.shards import Shard, ShardSet
from shoal.metadata.sharks import Sharks
from shoal.metadata.uploads import Uploads


class MetadataStore:
    def __init__(self, shards: ShardSet, window: timedelta) -> None:
        """`window`: the width of the deleted-table windows, fixed at first migrate."""
        self.shards = shards
        self.accounts = Accounts(shards, window)
        self.buckets = Buckets(shards, window)
        self.claims = BucketClaims(shards, window)
        self.inventories = Inventories(shards, window)
        self.objects = Objects(shards, window)
        self.uploads = Uploads(shards, window)
        self.garbage = Garbage(shards, window)
        self.gc_book = GarbageBook(shards, window)
        self.pipeline_runs = PipelineBook(shards, window)
        self.nodes = Nodes(shards, window)
        self.keys = Keys(shards, window)
        self.under_replicated = UnderReplicated(shards, window)
        self.sharks = Sharks(shards, window)

    @classmethod
    async def open(
        cls,
        configs: Sequence[ShardConfig],
        pool_max_size: int = 20,
        *,
        shard_key: bytes | None = None,
        poll_ring: bool = True,
    ) -> MetadataStore:
        """`shard_key`: the credentials key, with which the store opens the shards that
        `shoal shard add` adds while it runs (ShardSet). `poll_ring`: read the ring every
        few seconds in the background (without it, the store follows a move only when a
        shard refuses a statement)."""
        shards = await ShardSet.open(
            configs, pool_max_size, shard_key=shard_key, poll_ring=poll_ring
        )
        async with shards.catalog.pool.reading() as conn:
            window = await window_width(conn)
        return cls(shards, window)

    @property
    def ring(self) -> Ring:
        return self.shards.ring

    async def ensure_windows(self, ahead: int) -> int:
        """Create upcoming deleted-table windows on every shard (run periodically)."""
        created = 0
        for shard in self.shards.placed():
            async with shard.pool.connection() as conn:
                created += await ensure_windows(conn, shard.vnodes, await window_width(conn), ahead)
        return created

    async def silent_shards(self, timeout: float) -> list[str]:
        """The shards that do not answer a trivial statement within `timeout` seconds, each
        asked on a connection of its own (ShardPool.ping).

        A ping that has not answered in time is cancelled but not waited for: psycopg then
        asks the server to cancel the statement and waits up to seconds for it, which on a
        shard that hangs is exactly what does not come back.
        """
        shards = self._serving()
        pings = [asyncio.ensure_future(shard.pool.ping()) for shard in shards]
        try:
            await asyncio.wait(pings, timeout=timeout)
        except BaseException:  # cancelled itself (its process stopping): so are they
            for ping in pings:
                ping.cancel()
            raise
        silent = []
        for shard, ping in zip(shards, pings, strict=True):
            if not ping.done():
                ping.cancel()
                ping.add_done_callback(_forget)
                silent.append(shard.name)
            elif not ping.result():
                silent.append(shard.name)
        return silent

    def hung_shards(self) -> list[str]:
        """The shards whose commits hang, as their commit probes find (ShardPool.probe_commits):
        their writes are refused, their reads go on. Never waits; called every second."""
        return [shard.name for shard in self._serving() if not shard.pool.probe_commits()]

    def _serving(self) -> list[Shard]:
        """The catalog and the shards that hold vnodes. A shard that holds no vnode (added
        and not used yet, or drained for removal) serves nothing: its silence must not take
        the gateway out of service."""
        return [
            self.shards.catalog,
            *(s for s in self.shards.placed() if s is not self.shards.catalog),
        ]

    async def close(self) -> None:
        await self.shards.close()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _forget(ping: asyncio.Future[bool]) -> None:
    """Whatever became of a ping nobody waits for any more (no "never retrieved" warning)."""
    if not ping.cancelled():
        ping.exception()
