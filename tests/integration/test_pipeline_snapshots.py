"""The snapshots a job's driver exports for its readers: held while they read, let go the
moment the job is done with them, so that what the job does next (the gc job's VACUUM of the
windows it cleared) is not held back by them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from shoal.config import MetadataConfig
from shoal.metadata import migrate
from shoal.pipeline import io
from tests.fixtures.postgres import create_databases

HOLDING_A_SNAPSHOT = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend' AND backend_xmin IS NOT NULL"
)


def test_exported_snapshots_are_released_when_the_block_ends(
    admin_dsn: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    [shard] = create_databases(admin_dsn, 1)
    run(migrate([shard], MetadataConfig(vnodes=2, partitions_ahead=1)))
    with psycopg.connect(shard.dsn, autocommit=True) as watcher:
        with io.exported_snapshots([shard]) as snapshots:
            assert snapshots[shard.name]
            assert watcher.execute(HOLDING_A_SNAPSHOT).fetchone() == (1,)
        # No wait: the driver's backend has let go of its snapshot before the block returns.
        assert watcher.execute(HOLDING_A_SNAPSHOT).fetchone() == (0,)
