"""Re-replication: how long after a storage node comes back every under-replicated version has
its second copy again.

    .venv/bin/python bench/rereplication_bench.py                 # 1,000 versions of 64 KiB
    .venv/bin/python bench/rereplication_bench.py --versions 5000 --size 1048576

Set-up: the embedded PostgreSQL 18 (or `--dsn`, a superuser DSN; a scratch database is made
and dropped), `--vnodes` vnodes (default 8), two `shoal storage-node` processes on 127.0.0.1.

1. Node n1 is stopped. N versions of `--size` bytes are written as the gateway writes them
   (DataPath.write, then objects.put), 16 at a time, by a writer whose registry no longer
   offers n1: each lands on n0 alone and is noted as under-replicated.
2. n1 is started again on its folder. Once it answers at the address it registered, the clock
   starts, and re-replication passes (Rereplicator.run_once, the daemon's pass with its
   default batches and concurrency) run back to back until no note is left. The daemon in
   `shoal serve` starts a pass every 5 s, so it adds up to 5 s before its first pass; that
   wait is not in the figure.
3. The rows naming fewer than two nodes are counted (0 expected).

Prints versions restored per second and seconds per thousand versions. Everything binds
127.0.0.1; nodes, PostgreSQL and the scratch folder are cleaned up on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from benchlib import scratch_shard, server_and_scratch, write_objects
from psycopg import sql
from storage_bench import NodeCluster, node_cluster, start_node, stop_nodes, wait_until_serving

from shoal.cluster import RegistryDirectory
from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import MetadataStore, migrate
from shoal.metadata.ring import vnode_schema
from shoal.replication import Rereplicator
from shoal.storage import BlockClient, DataPath, Node

HEARTBEAT_DEADLINE = timedelta(seconds=30)
WRITERS = 16


class WithoutNode(RegistryDirectory):
    """The registry as a writer sees it once a stopped node's heartbeat is past the deadline."""

    def __init__(self, store: MetadataStore, client: BlockClient, shark: str) -> None:
        super().__init__(store, HEARTBEAT_DEADLINE, client)
        self.shark = shark

    async def writable_nodes(self) -> list[Node]:
        return [n for n in await super().writable_nodes() if n.shark != self.shark]


async def wait_registered(store: MetadataStore, name: str, url: str) -> None:
    """Until the registry names the node at its new address, alive."""
    while True:
        nodes = await store.nodes.list(HEARTBEAT_DEADLINE)
        if any(n.name == name and n.url == url and n.alive for n in nodes):
            return
        await asyncio.sleep(0.1)


def bench(args: argparse.Namespace, dsn: str, root: Path) -> None:
    with scratch_shard(dsn) as shard:
        # First, so that the ring has --vnodes (node_cluster's own migrate then changes nothing).
        asyncio.run(migrate([shard], MetadataConfig(vnodes=args.vnodes, partitions_ahead=1)))
        with node_cluster(shard, root, ["n0", "n1"]) as cluster:
            asyncio.run(stop_and_restore(args, shard, cluster, root))


async def stop_and_restore(
    args: argparse.Namespace, shard: ShardConfig, cluster: NodeCluster, root: Path
) -> None:
    store = await MetadataStore.open([shard], 20)
    client = BlockClient(cluster.secret)
    try:
        await wait_until_serving(client, cluster.nodes)
        for node in cluster.nodes:
            await wait_registered(store, node.name, node.url)
        down = cluster.nodes[1]
        stop_nodes([down])
        writer = DataPath(client, WithoutNode(store, client, f"{down.datacenter}:{down.name}"))
        started = time.monotonic()
        await write_objects(store, writer, args.versions, args.size, WRITERS)
        noted = await store.under_replicated.count()
        print(
            f"wrote {args.versions} versions of {args.size} bytes with n1 down in "
            f"{time.monotonic() - started:.1f} s; {noted} noted as under-replicated"
        )

        back = start_node(cluster.config_file, root, down.name, down.datacenter)
        cluster.nodes[1] = back
        await wait_until_serving(client, [back])
        await wait_registered(store, back.name, back.url)
        directory = RegistryDirectory(store, HEARTBEAT_DEADLINE, client)
        restorer = Rereplicator(store, DataPath(client, directory))
        started = time.monotonic()
        passes = 0
        while await store.under_replicated.count():
            await restorer.run_once()
            passes += 1
        seconds = time.monotonic() - started
        print(
            f"restored {noted} versions in {seconds:.2f} s ({passes} passes): "
            f"{noted / seconds:.0f} versions/s, "
            f"{seconds / noted * 1000:.2f} s per thousand versions"
        )
        short = short_rows(shard.dsn, args.vnodes)
        print(f"rows naming fewer than 2 nodes afterwards: {short}")
    finally:
        await client.close()
        await store.close()


def short_rows(dsn: str, vnodes: int) -> int:
    with psycopg.connect(dsn) as conn:
        return sum(
            conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {}.manta_bucket_object WHERE cardinality(sharks) < 2"
                ).format(sql.Identifier(vnode_schema(v)))
            ).fetchone()[0]  # type: ignore[index]
            for v in range(vnodes)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per version")
    parser.add_argument("--vnodes", type=int, default=8)
    parser.add_argument("--dsn", help="a superuser DSN (default: an embedded server)")
    args = parser.parse_args()
    with server_and_scratch(args.dsn, "shoal-repl-bench-") as (dsn, scratch):
        bench(args, dsn, scratch)


if __name__ == "__main__":
    sys.exit(main())
