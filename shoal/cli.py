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

from shoal.config import Config, ConfigError, load_config
from shoal.metadata import MetadataError, MetadataStore, migrate
from shoal.metadata.deployment import shard_configs
from shoal.metadata.status import cluster_status

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
        ring, statuses = asyncio.run(cluster_status(shards))
    if args.json:
        print(
            json.dumps(
                {
                    "ring": {"version": ring.version, "vnodes": ring.vnodes},
                    "shards": [s.__dict__ for s in statuses],
                },
                indent=2,
            )
        )
        return 0
    print(f"ring version {ring.version}: {ring.vnodes} vnodes over {len(ring.shards)} shard(s)")
    for s in statuses:
        versions = ", ".join(f"{k} v{v}" for k, v in sorted(s.schema_versions.items()))
        print(f"\nshard {s.name} (PostgreSQL {s.server_version})")
        print(f"  vnodes          {_ranges(s.vnodes) or 'none'}")
        print(f"  schema          {versions or 'not migrated'}")
        print(f"  deleted windows {s.windows}")
        for table, count in s.row_counts.items():
            print(f"  {table:<28} {count:>12,}")
    return 0


def _db_dsn(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config) as shards:
        for shard in shards:
            print(shard.dsn)
    return 0


def _serve(config: Config, args: argparse.Namespace) -> int:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with _serve_lock(config.data_dir), shard_configs(config) as shards:
        asyncio.run(migrate(shards, config.metadata))
        print(f"Shoal is running (data directory {config.data_dir})", flush=True)
        for shard in shards:
            print(f"  metadata shard {shard.name}: {shard.dsn}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        asyncio.run(_serve_until_stopped(config, shards))
    print("Shoal stopped.", flush=True)
    return 0


async def _serve_until_stopped(config: Config, shards: list) -> None:  # type: ignore[type-arg]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
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
