"""How a shard's connection pool hands out connections."""

from __future__ import annotations

import asyncio
from typing import Any

from shoal.metadata.shards import LastInFirstOutPool
from tests.fixtures.postgres import MakeStore


def test_pool_hands_out_the_connection_returned_last(make_store: MakeStore, run: Any) -> None:
    store = make_store(shards=1, vnodes=2, pool_max_size=4)
    pool = store.shards.placed()[0].pool
    assert isinstance(pool, LastInFirstOutPool)

    async def backend_pids() -> list[int]:
        acquired = asyncio.Semaphore(0)

        async def hold(release: asyncio.Event) -> int:
            async with pool.connection() as conn:
                acquired.release()
                await release.wait()
                return conn.info.backend_pid

        # Grow the pool to four connections, then return them in a known order.
        releases = [asyncio.Event() for _ in range(4)]
        holders = [asyncio.create_task(hold(r)) for r in releases]
        for _ in holders:
            await acquired.acquire()
        pids = []
        for release, holder in zip(releases, holders, strict=True):
            release.set()
            pids.append(await holder)
        assert len(set(pids)) == 4

        served = []
        for _ in range(3):
            async with pool.connection() as conn:
                served.append(conn.info.backend_pid)
        return [pids[-1], *served]

    last_returned, *served = run(backend_pids())
    assert served == [last_returned] * 3
