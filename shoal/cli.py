"""`shoal`: the one command-line entry point.

Every verb takes `--data-dir DIR` (default ./shoal-data) or `--config FILE`, so several
instances run side by side. Errors print one line and exit non-zero; no stack traces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from shoal.cluster import LocalNodes, NodeSettings, run_storage_node
from shoal.config import Config, ConfigError, load_config
from shoal.metadata import MetadataError, MetadataStore, migrate
from shoal.metadata.deployment import shard_configs
from shoal.metadata.status import cluster_status
from shoal.storage.auth import load_or_create_secret

# How often `shoal serve` makes sure the deleted-table windows ahead of now exist.
WINDOW_MAINTENANCE_INTERVAL = timedelta(minutes=10)


class CommandError(Exception):
    """A failure to report to the user as one line."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        config = load_config(args.config, args.data_dir)
        return int(args.run(config, args) or 0)
    except (ConfigError, MetadataError, CommandError) as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, help="data directory (default ./shoal-data)")
    where.add_argument("--config", type=Path, help="configuration file (TOML)")

    parser = argparse.ArgumentParser(prog="shoal", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(title="commands")

    serve = verbs.add_parser("serve", parents=[common], help="run Shoal until Ctrl-C")
    serve.set_defaults(run=_serve)

    node = verbs.add_parser("storage-node", parents=[common], help="run one storage node")
    node.add_argument("--dir", type=Path, required=True, help="folder for this node's blocks")
    node.add_argument("--port", type=int, required=True)
    node.add_argument("--name", required=True, help="node name, unique in the cluster")
    node.add_argument("--datacenter", default="local")
    node.add_argument("--host", default="127.0.0.1", help="address to listen on")
    node.add_argument("--url", help="address others use, if not http://HOST:PORT")
    node.set_defaults(run=_storage_node)

    db = verbs.add_parser("db", help="the metadata database").add_subparsers(title="db commands")
    db.add_parser("migrate", parents=[common], help="create or upgrade the schema").set_defaults(
        run=_db_migrate
    )
    status = db.add_parser("status", parents=[common], help="shards, vnodes, versions, rows")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_db_status)
    db.add_parser("dsn", parents=[common], help="each shard's DSN, one a line").set_defaults(
        run=_db_dsn
    )
    return parser


def _db_migrate(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config) as shards:
        ring = asyncio.run(migrate(shards, config.metadata))
    print(f"migrated {len(shards)} shard(s); ring version {ring.version}, {ring.vnodes} vnodes")
    return 0


def _db_status(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config) as shards:
        status = asyncio.run(cluster_status(shards, config.storage.heartbeat_deadline))
    ring = status.ring
    if args.json:
        report = {
            "ring": {"version": ring.version, "vnodes": ring.vnodes},
            "shards": [s.__dict__ for s in status.shards],
            "storage_nodes": [{**n.__dict__, "shark": n.shark} for n in status.nodes],
        }
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"ring version {ring.version}: {ring.vnodes} vnodes over {len(ring.shards)} shard(s)")
    for s in status.shards:
        versions = ", ".join(f"{k} v{v}" for k, v in sorted(s.schema_versions.items()))
        print(f"\nshard {s.name} (PostgreSQL {s.server_version})")
        print(f"  vnodes          {_ranges(s.vnodes) or 'none'}")
        print(f"  schema          {versions or 'not migrated'}")
        print(f"  deleted windows {s.windows}")
        for table, count in s.row_counts.items():
            print(f"  {table:<28} {count:>12,}")
    print(f"\nstorage nodes: {sum(n.alive for n in status.nodes)} alive of {len(status.nodes)}")
    for n in status.nodes:
        state = "alive" if n.alive else "SILENT"
        free = f"{(n.free_bytes or 0) / 2**30:,.1f} GiB free"
        print(f"  {n.shark:<24} {state:<7} {n.url}  {free}")
    return 0


def _db_dsn(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config) as shards:
        for shard in shards:
            print(shard.dsn)
    return 0


def _serve(config: Config, args: argparse.Namespace) -> int:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    load_or_create_secret(config.secret_file)
    nodes = LocalNodes(config, _where(config, args))
    with _serve_lock(config.data_dir), shard_configs(config) as shards:
        asyncio.run(migrate(shards, config.metadata))
        try:
            node_lines = nodes.start()
            print(f"Shoal is running (data directory {config.data_dir})", flush=True)
            for shard in shards:
                print(f"  metadata shard {shard.name}: {shard.dsn}", flush=True)
            for line in node_lines:
                print(f"  storage node {line}", flush=True)
            print("Press Ctrl-C to stop.", flush=True)
            asyncio.run(_run_until_stopped(_maintain_windows, config, shards))
        finally:
            nodes.stop()
    print("Shoal stopped.", flush=True)
    return 0


def _storage_node(config: Config, args: argparse.Namespace) -> int:
    settings = NodeSettings(
        root=args.dir.absolute(),
        host=args.host,
        port=args.port,
        name=args.name,
        datacenter=args.datacenter,
        url=args.url,
    )
    if not args.name.isidentifier() or not args.datacenter.isidentifier():
        raise CommandError("--name and --datacenter must be letters, digits and underscores")
    with shard_configs(config) as shards:
        asyncio.run(_run_until_stopped(run_storage_node, config, shards, settings))
    return 0


async def _run_until_stopped(serve, *args) -> None:  # type: ignore[no-untyped-def]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await serve(*args, stop)
    except OSError as exc:
        raise CommandError(str(exc)) from None


def _where(config: Config, args: argparse.Namespace) -> list[str]:
    """The --config/--data-dir arguments that make a child process see this configuration."""
    if args.config is not None:
        return ["--config", str(args.config.absolute())]
    return ["--data-dir", str(config.data_dir)]


async def _maintain_windows(config: Config, shards: list, stop: asyncio.Event) -> None:  # type: ignore[type-arg]
    async with await MetadataStore.open(shards, config.metadata.pool_max_size) as store:
        while not stop.is_set():
            await store.ensure_windows(config.metadata.partitions_ahead)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WINDOW_MAINTENANCE_INTERVAL.total_seconds())


@contextlib.contextmanager
def _serve_lock(data_dir: Path):  # type: ignore[no-untyped-def]
    with open(data_dir / "serve.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommandError(f"another `shoal serve` is running on {data_dir}") from None
        yield


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'"""
    parts: list[str] = []
    for value in values:
        if parts and parts[-1].split("-")[-1] == str(value - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{value}"
        else:
            parts.append(str(value))
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
