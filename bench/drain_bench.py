"""Node drain: how long `shoal pipeline rebalance` takes to move a drained node's copies, per GiB.

    .venv/bin/python bench/drain_bench.py                       # 1 GiB written, 4 MiB objects
    .venv/bin/python bench/drain_bench.py --gib 8 --size 16777216

Set-up: the embedded PostgreSQL 18 (or `--dsn`, a superuser DSN; a scratch database is made
and dropped), `--vnodes` vnodes (default 8), four `shoal storage-node` processes on
127.0.0.1 in two datacenters (n0, n2 in dc0; n1, n3 in dc1), a local Spark (`--master`,
default local[*]).

1. `--gib` GiB of objects of `--size` bytes are written as the gateway writes them
   (DataPath.write, two copies in distinct datacenters, then objects.put), 16 at a time.
2. n0 is drained (its state in the registry) and `shoal pipeline rebalance` runs once, in a
   Spark session started beforehand (its start-up is not in the figure).
3. The rows still naming n0 and n0's block files are counted (0 expected), and rebalance runs
   once more with nothing to move: the cost of a run itself (Spark stages, reading the rows).

Prints the GiB moved, the job's seconds (its own clock: reading the rows, the copies, the
conditional updates, the deletes), MiB/s, and the seconds of the run with nothing to move.
Everything binds 127.0.0.1; nodes, PostgreSQL and the scratch folder are cleaned up on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchlib import scratch_shard, server_and_scratch, write_objects
from storage_bench import node_cluster, start_node, wait_until_serving

from shoal.cluster import RegistryDirectory
from shoal.config import MetadataConfig, load_config
from shoal.metadata import MetadataStore, migrate
from shoal.pipeline import run_job
from shoal.pipeline.session import spark_session
from shoal.storage import BlockClient, DataPath

HEARTBEAT_DEADLINE = timedelta(seconds=30)
WRITERS = 16
GiB = 1024**3


async def prepare(config_file: Path, args: argparse.Namespace, client_secret: bytes) -> None:
    """Write the objects once the four nodes are registered, then drain n0."""
    config = load_config(config_file, None)
    store = await MetadataStore.open(list(config.metadata.shards), 20)
    client = BlockClient(client_secret)
    try:
        while len([n for n in await store.nodes.list(HEARTBEAT_DEADLINE) if n.alive]) < 4:
            await asyncio.sleep(0.2)
        path = DataPath(client, RegistryDirectory(store, HEARTBEAT_DEADLINE, client))
        count = max(1, int(args.gib * GiB) // args.size)
        started = time.monotonic()
        await write_objects(store, path, count, args.size, WRITERS)
        print(
            f"wrote {count} objects of {args.size} bytes (two copies) in "
            f"{time.monotonic() - started:.1f} s"
        )
        await store.nodes.set_state("n0", "draining")
    finally:
        await client.close()
        await store.close()


async def left_on_n0(config_file: Path) -> int:
    config = load_config(config_file, None)
    async with await MetadataStore.open(list(config.metadata.shards), 2) as store:
        return (await store.sharks.naming("dc0:n0")).rows


def bench(args: argparse.Namespace, dsn: str, root: Path) -> None:
    with scratch_shard(dsn) as shard:
        asyncio.run(migrate([shard], MetadataConfig(vnodes=args.vnodes, partitions_ahead=1)))
        with node_cluster(shard, root, []) as cluster:
            for index in range(4):
                node = start_node(cluster.config_file, root, f"n{index}", f"dc{index % 2}")
                cluster.nodes.append(node)
            client = BlockClient(cluster.secret)
            asyncio.run(wait_until_serving(client, cluster.nodes))
            asyncio.run(prepare(cluster.config_file, args, cluster.secret))
            config = load_config(cluster.config_file, None)
            spark = spark_session("drain-bench", args.master, root / "spark.log")

            def rebalance() -> Any:
                shards = list(config.metadata.shards)
                return run_job("rebalance", config, shards, spark=spark, output=root / "pipeline")

            try:
                summary = rebalance()
                idle = rebalance()  # nothing left to move: what a run costs by itself
            finally:
                spark.stop()
            moved = summary.figures["bytes moved"] / GiB
            seconds = summary.figures["seconds"]
            print(summary.table())
            print(
                f"drain: {moved:.3f} GiB moved in {seconds:.1f} s: "
                f"{moved * 1024 / max(seconds, 1e-9):.1f} MiB/s, "
                f"{seconds / max(moved, 1e-9):.1f} s per GiB"
            )
            print(f"a run with nothing to move: {idle.figures['seconds']:.1f} s")
            files = list((cluster.nodes[0].root / "blocks").glob("*/*"))
            rows = asyncio.run(left_on_n0(cluster.config_file))
            print(f"afterwards: {rows} rows name n0, {len(files)} block files on n0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB written before the drain")
    parser.add_argument("--size", type=int, default=4 * 1024 * 1024, help="bytes per object")
    parser.add_argument("--vnodes", type=int, default=8)
    parser.add_argument("--master", default="local[*]", help="Spark master URL")
    parser.add_argument("--dsn", help="a superuser DSN (default: an embedded server)")
    args = parser.parse_args()
    with server_and_scratch(args.dsn, "shoal-drain-bench-") as (dsn, scratch):
        bench(args, dsn, scratch)


if __name__ == "__main__":
    sys.exit(main())
