"""`shoal`: the one command-line entry point.

Every verb takes `--data-dir DIR` (default ./shoal-data) or `--config FILE`, so several
instances run side by side. Errors print one line and exit non-zero; no stack traces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gc
import json
import logging
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from psycopg.conninfo import conninfo_to_dict

# The verbs that run services or jobs (serve, storage-node, gc run, pipeline, status) import
# what they run inside themselves: every command is a Python process of its own, and the short
# ones (db, ring, shard, account, node) should not pay to import the gateway, aiohttp and
# awscrt, which cost about as much CPU as all the rest (tests/unit/test_cli_startup.py).
import shoal.logs
import shoal.loop
from shoal.config import Config, ConfigError, ShardConfig, check_dsn, load_config
from shoal.credentials import Credentials, KeyPair, load_encryption_key
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import MetadataError, MetadataStore, migrate
from shoal.metadata.claims import EXPLANATIONS, Check, Difference
from shoal.metadata.deployment import (
    create_embedded_database,
    embedded_server,
    require_instance,
    shard_configs,
)
from shoal.metadata.moves import (
    DEFAULT_GRACE,
    Mover,
    MoveRecord,
    MoveResult,
    add_shard,
    plan_rebalance,
)
from shoal.metadata.ring import Ring
from shoal.metadata.status import cluster_status

if TYPE_CHECKING:
    from shoal.metadata.garbage import Backlog, GcRun

# Files 0600, folders 0700 (see main).
PRIVATE_UMASK = 0o077
# Set (to anything) for Shoal's DEBUG lines and the trace of an unexpected error.
DEBUG_ENV = "SHOAL_DEBUG"
# `shoal status`'s exit code when it could read the cluster and found it not ready, or a
# shard refusing writes because its commits hang (1 is a command that failed to run).
STATUS_NOT_READY = 3
T = TypeVar("T")


class CommandError(Exception):
    """A failure to report to the user as one line."""


def command() -> NoReturn:
    """The `shoal` command (and `python -m shoal.cli`): main(), then the process exits.

    The heap is frozen first: the interpreter's last collection at exit would otherwise walk
    every object of the modules imported, a good part of a short process's CPU, only to
    free memory the exit frees anyway (docs/decisions.md, "A process exits without a last
    collection")."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)  # a group without its command exits 2, naming it
    shoal.logs.configure()  # until the configuration names the format
    debug = bool(os.environ.get(DEBUG_ENV))
    # Whatever Shoal and its children make (data directory, blocks, PostgreSQL's files, Spark's
    # outputs, logs) is readable by its own user only: objects must not leak to other local
    # users who have no S3 credentials.
    os.umask(PRIVATE_UMASK)
    try:
        config = load_config(args.config, args.data_dir)
        shoal.logs.configure(config.log.format)
        if debug:
            logging.getLogger("shoal").setLevel(logging.DEBUG)
        # Before anything is made: a mistyped --data-dir gets no key files nor new cluster.
        if not getattr(args, "creates_instance", False):
            require_instance(config)
        code = int(args.run(config, args) or 0)
        sys.stdout.flush()  # here, where a reader gone away is caught, not at exit
        return code
    except (ConfigError, MetadataError, CommandError) as exc:
        if shoal.logs.current_format() == "json":  # a log shipper reads stderr
            logging.getLogger("shoal").error("%s", exc)
        else:
            print(f"shoal: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not the command's failure
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 128 + signal.SIGPIPE
    except Exception as exc:  # a failure nobody foresaw: still one line, the trace on demand
        if debug:
            raise
        print(
            f"shoal: error: {type(exc).__name__}: {_first_line(exc)} "
            f"(run again with {DEBUG_ENV}=1 for the trace)",
            file=sys.stderr,
        )
        return 1


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # With both, --data-dir replaces the file's data_dir: gateways sharing one file on one
    # machine each keep their own folder (docs/operations.md, "A multi-machine layout").
    common.add_argument(
        "--data-dir", type=Path, help="data directory (default ./shoal-data, or the file's)"
    )
    common.add_argument("--config", type=Path, help="configuration file (TOML)")

    parser = argparse.ArgumentParser(prog="shoal", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(title="commands", dest="command", required=True)

    serve = verbs.add_parser("serve", parents=[common], help="run Shoal until Ctrl-C")
    serve.add_argument(
        "--port", type=int, help="S3 port on 127.0.0.1 (default 9000; 0: any free one, printed)"
    )
    serve.add_argument(
        "--admin-port", type=int, help="admin port (default 9001; 0: any free one, printed)"
    )
    serve.set_defaults(run=_serve, creates_instance=True)

    gc = verbs.add_parser("gc", help="garbage collection").add_subparsers(
        title="gc commands", dest="command", required=True
    )
    gc_run = gc.add_parser("run", parents=[common], help="one GC pass now")
    gc_run.add_argument("--leeway", help="only garbage older than this (0s, 15m, 24h; default 24h)")
    gc_run.set_defaults(run=_gc_run)
    gc_status = gc.add_parser("status", parents=[common], help="backlog and last runs")
    gc_status.add_argument("--json", action="store_true", help="print JSON")
    gc_status.set_defaults(run=_gc_status)
    gc.add_parser("pause", parents=[common], help="pause the GC daemon").set_defaults(
        run=lambda config, args: _gc_pause(config, True)
    )
    gc.add_parser("resume", parents=[common], help="resume the GC daemon").set_defaults(
        run=lambda config, args: _gc_pause(config, False)
    )

    pipeline = verbs.add_parser("pipeline", parents=[common], help="run a Spark job")
    pipeline.add_argument(
        "job",
        help="gc, audit, orphans, meter, lifecycle, inventory or rebalance; history: the past runs",
    )
    pipeline.add_argument("--master", help="Spark master URL (default local[*])")
    pipeline.add_argument("--output", type=Path, help="output folder (default DATA_DIR/pipeline)")
    pipeline.add_argument("--leeway", help="gc: only garbage older than this (default 24h)")
    pipeline.add_argument("--plot", type=Path, help="meter: draw usage over time to FILE.png")
    pipeline.add_argument("--repair", action="store_true", help="audit: copy good replicas")
    pipeline.add_argument("--delete", action="store_true", help="orphans: delete them")
    pipeline.add_argument("--bucket", help="inventory: deliver only this bucket's reports")
    pipeline.add_argument(
        "--force", action="store_true", help="inventory: deliver every report, due or not"
    )
    pipeline.add_argument("--json", action="store_true", help="print the summary as JSON")
    pipeline.add_argument("--job", dest="history_job", help="history: only this job's runs")
    pipeline.add_argument(
        "--limit", type=int, default=20, help="history: this many runs, newest first (20)"
    )
    pipeline.set_defaults(run=_pipeline)

    account = verbs.add_parser("account", help="accounts and their access keys")
    accounts = account.add_subparsers(title="account commands", dest="command", required=True)
    create = accounts.add_parser("create", parents=[common], help="new account and key")
    create.add_argument("name")
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(run=_account_create)
    accounts.add_parser("list", parents=[common], help="accounts and keys").set_defaults(
        run=_account_list
    )
    show_root = accounts.add_parser(
        "show-root", parents=[common], help="the root account's access key and its secret"
    )
    show_root.add_argument("--json", action="store_true", help="print JSON")
    show_root.set_defaults(run=_show_root)
    keys = accounts.add_parser("key", help="access keys").add_subparsers(
        title="key commands", dest="command", required=True
    )
    add = keys.add_parser("add", parents=[common], help="another key for an account")
    add.add_argument("name")
    add.add_argument("--json", action="store_true", help="print JSON")
    add.set_defaults(run=_key_add)
    revoke = keys.add_parser("revoke", parents=[common], help="revoke an access key")
    revoke.add_argument("access_key_id")
    revoke.set_defaults(run=_key_revoke)

    node = verbs.add_parser("storage-node", parents=[common], help="run one storage node")
    node.add_argument("--dir", type=Path, required=True, help="folder for this node's blocks")
    node.add_argument("--port", type=int, required=True)
    node.add_argument("--name", required=True, help="node name, unique in the cluster")
    node.add_argument("--datacenter", default="local")
    node.add_argument("--host", default="127.0.0.1", help="address to listen on")
    node.add_argument("--url", help="address others use, if not http(s)://HOST:PORT")
    node.add_argument("--admin-port", type=int, help="health and metrics port (default: none)")
    node.add_argument(
        "--listen-fd",
        type=int,
        help="an inherited socket, listening on --port, to serve on instead of binding one",
    )
    node.add_argument(
        "--admin-listen-fd",
        type=int,
        help="an inherited socket, listening on --admin-port, for health and metrics",
    )
    node.add_argument(
        "--capacity-bytes",
        type=int,
        help="use at most this much of the disk (default: [storage] capacity_bytes, or all)",
    )
    node.set_defaults(run=_storage_node)

    nodes = verbs.add_parser("node", help="storage nodes: list, drain, mark dead, remove")
    node_verbs = nodes.add_subparsers(title="node commands", dest="command", required=True)
    listing = node_verbs.add_parser("list", parents=[common], help="nodes, states, free, blocks")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=_node_list)
    for verb, help_text in (
        ("drain", "take no new blocks; `shoal pipeline rebalance` moves its copies away"),
        ("undrain", "take new blocks again"),
        ("mark-dead", "never ask it again; its copies are made again from the other replicas"),
        ("remove", "forget a node that holds nothing"),
    ):
        change = node_verbs.add_parser(verb, parents=[common], help=help_text)
        change.add_argument("name", help="the node's name (or datacenter:name)")
        change.set_defaults(run=_node_change, verb=verb)

    status = verbs.add_parser(
        "status", parents=[common], help="cluster, nodes, accounts, GC and pipeline at a glance"
    )
    status.add_argument("--json", action="store_true", help="print JSON (the admin API's)")
    status.set_defaults(run=_status)

    db = verbs.add_parser("db", help="the metadata database").add_subparsers(
        title="db commands", dest="command", required=True
    )
    db.add_parser("migrate", parents=[common], help="create or upgrade the schema").set_defaults(
        run=_db_migrate, creates_instance=True
    )
    status = db.add_parser("status", parents=[common], help="shards, vnodes, versions, rows")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_db_status)
    db.add_parser(
        "dsn", parents=[common], help="each shard's DSN, password included, one a line (for psql)"
    ).set_defaults(run=_db_dsn)
    check = db.add_parser(
        "check",
        parents=[common],
        help="bucket names in the catalog against bucket rows (after restoring shards)",
    )
    check.add_argument(
        "--repair", action="store_true", help="bring each difference back in step, where it can"
    )
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(run=_db_check)

    shard = verbs.add_parser("shard", help="metadata shards").add_subparsers(
        title="shard commands", dest="command", required=True
    )
    shard_add = shard.add_parser(
        "add", parents=[common], help="add a shard (migrated, no vnodes until moved there)"
    )
    shard_add.add_argument("name")
    shard_add.add_argument(
        "dsn", nargs="?", help="its PostgreSQL DSN (embedded: omit, a database is made)"
    )
    shard_add.set_defaults(run=_shard_add)
    grace = argparse.ArgumentParser(add_help=False)
    grace.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE.total_seconds(),
        help="seconds a moved vnode's old copy is kept before it is dropped (default 300)",
    )
    for verb, what, run in (
        ("drain", "move every vnode of a shard to the others, evenly", _shard_drain),
        ("remove", "forget an added shard that holds nothing (its database stays)", _shard_remove),
    ):
        by_name = shard.add_parser(verb, parents=[common, grace], help=what)
        by_name.add_argument("name")
        by_name.set_defaults(run=run)

    ring = verbs.add_parser("ring", help="the ring of vnodes").add_subparsers(
        title="ring commands", dest="command", required=True
    )
    ring_status = ring.add_parser("status", parents=[common], help="ring versions and moves")
    ring_status.add_argument("--json", action="store_true", help="print JSON")
    ring_status.set_defaults(run=_ring_status)
    move = ring.add_parser(
        "move", parents=[common, grace], help="move vnodes to a shard (resumes a crashed move)"
    )
    move.add_argument("vnodes", nargs="*", type=int, metavar="VNODE")
    move.add_argument("--to", dest="target", help="the shard to move them to")
    move.add_argument(
        "--finish", action="store_true", help="only resume, roll back and drop old copies"
    )
    move.set_defaults(run=_ring_move)
    ring.add_parser(
        "rebalance", parents=[common, grace], help="move vnodes until every shard holds as many"
    ).set_defaults(run=_ring_rebalance)
    return parser


def _shard_add(config: Config, args: argparse.Namespace) -> int:
    key = load_encryption_key(config.credentials_key_file)
    with shard_configs(config) as shards:
        if any(shard.name == args.name for shard in shards):
            raise CommandError(f"shard {args.name} is known already")
        dsn = args.dsn
        if dsn is None and not config.metadata.embedded:
            raise CommandError("give the new shard's DSN")
        if dsn is None:
            dsn = create_embedded_database(embedded_server(config), args.name)
        check_dsn(dsn, f"shard {args.name}")
        shoal.loop.run(add_shard(shards[0], ShardConfig(args.name, dsn), key, config.metadata))
    print(f"added shard {args.name}; move vnodes to it with `shoal ring move` or `rebalance`")
    return 0


def _shard_drain(config: Config, args: argparse.Namespace) -> int:
    async def drain(mover: Mover, names: list[str]) -> None:
        if args.name not in names:
            raise CommandError(f"unknown shard {args.name!r}")
        others = [name for name in names if name != args.name]
        if not others:
            raise CommandError(f"shard {args.name} is the only shard: nowhere to move to")
        ring, _, _ = await mover.status()
        plan = plan_rebalance(ring, others)
        if not ring.vnodes_of(args.name):
            print(f"shard {args.name} holds no vnode")
        for vnode, target in plan:
            _print_move(vnode, target, await mover.move(vnode, target))

    _with_mover(config, args, drain)
    return 0


def _shard_remove(config: Config, args: argparse.Namespace) -> int:
    async def remove(mover: Mover, names: list[str]) -> None:
        await mover.remove_shard(args.name)

    _with_mover(config, args, remove)
    print(f"removed shard {args.name}; its database is yours to drop")
    return 0


def _with_mover(
    config: Config,
    args: argparse.Namespace,
    action: Callable[[Mover, list[str]], Awaitable[T]],
) -> T:
    """Run `action(mover, shard names)` after the mover resumed or rolled back what a
    crashed one left, and dropped the old copies past their grace period."""
    if args.grace < 0:
        raise CommandError("--grace must be 0 or more seconds")

    async def run(shards: list[ShardConfig]) -> T:
        async with Mover(shards, config.metadata, timedelta(seconds=args.grace)) as mover:
            for line in [*await mover.recover(), *await mover.finish()]:
                print(line, flush=True)
            done = await action(mover, [shard.name for shard in shards])
            for line in await mover.finish():  # with --grace 0, the copies just left
                print(line, flush=True)
            return done

    with shard_configs(config) as shards:
        return shoal.loop.run(run(shards))


def _ring_move(config: Config, args: argparse.Namespace) -> int:
    if args.vnodes and not args.target:
        raise CommandError("say where to: --to SHARD")
    if not args.vnodes and not args.finish:
        raise CommandError("name the vnodes to move, or --finish")

    async def moves(mover: Mover, names: list[str]) -> None:
        for vnode in args.vnodes:
            _print_move(vnode, args.target, await mover.move(vnode, args.target))

    _with_mover(config, args, moves)
    return 0


def _ring_rebalance(config: Config, args: argparse.Namespace) -> int:
    async def rebalance(mover: Mover, names: list[str]) -> None:
        ring, _, _ = await mover.status()
        plan = plan_rebalance(ring, names)
        if not plan:
            print(f"balanced: {ring.vnodes} vnodes over {len(names)} shard(s)")
        for vnode, target in plan:
            _print_move(vnode, target, await mover.move(vnode, target))

    _with_mover(config, args, rebalance)
    return 0


def _print_move(vnode: int, target: str, result: MoveResult | None) -> None:
    if result is None:
        print(f"vnode {vnode} is on shard {target} already", flush=True)
        return
    print(
        f"vnode {vnode}: {result.source} -> {result.target}, ring version {result.ring_version}; "
        f"copied in {result.copy_seconds:.2f} s, writes paused {result.write_pause_seconds:.3f} s",
        flush=True,
    )


def _ring_status(config: Config, args: argparse.Namespace) -> int:
    async def read(
        shards: list[ShardConfig],
    ) -> tuple[Ring, list[dict[str, Any]], list[MoveRecord]]:
        mover = Mover(shards, config.metadata)
        try:
            return await mover.status()
        finally:
            await mover.close()

    with shard_configs(config) as shards:
        ring, versions, moves = shoal.loop.run(read(shards))
        names = [shard.name for shard in shards]
    placed = {name: ring.vnodes_of(name) for name in names}
    if args.json:
        report = {
            "ring": {"version": ring.version, "vnodes": ring.vnodes},
            "shards": [{"name": name, "vnodes": vnodes} for name, vnodes in placed.items()],
            "versions": versions,
            "moves": [move.__dict__ for move in moves],
        }
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"ring version {ring.version}: {ring.vnodes} vnodes over {len(names)} shard(s)")
    for name, vnodes in placed.items():
        print(f"  {name:<16} {len(vnodes):>5} vnodes  {_ranges(vnodes) or '-'}")
    print("versions:")
    for v in versions:
        print(f"  {v['version']:>5}  {v['created']:%Y-%m-%d %H:%M:%S}")
    print("moves (newest first):")
    for m in moves or []:
        pause = "" if m.write_pause_seconds is None else f", paused {m.write_pause_seconds:.3f} s"
        print(
            f"  #{m.id:<4} vnode {m.vnode:<5} {m.source} -> {m.target}  {m.step}"
            f"  {m.updated:%Y-%m-%d %H:%M:%S}{pause}"
        )
    if not moves:
        print("  none")
    return 0


def _db_migrate(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config, create=True) as shards:
        ring = shoal.loop.run(migrate(shards, config.metadata))
    print(f"migrated {len(shards)} shard(s); ring version {ring.version}, {ring.vnodes} vnodes")
    return 0


def _db_status(config: Config, args: argparse.Namespace) -> int:
    with shard_configs(config) as shards:
        status = shoal.loop.run(cluster_status(shards, config.storage.heartbeat_deadline))
    ring = status.ring
    if args.json:
        report = {
            "ring": {"version": ring.version, "vnodes": ring.vnodes},
            "shards": [s.__dict__ for s in status.shards],
            "storage_nodes": [{**n.__dict__, "shark": n.shark} for n in status.nodes],
        }
        print(json.dumps(report, indent=2, default=str))
        return 0
    held, known = len(ring.shards), len(status.shards)
    over = f"{held} shard(s)" if held == known else f"{held} of {known} shard(s)"
    print(f"ring version {ring.version}: {ring.vnodes} vnodes over {over}")
    for s in status.shards:
        versions = ", ".join(f"{k} v{v}" for k, v in sorted(s.schema_versions.items()))
        print(f"\nshard {s.name} (PostgreSQL {s.server_version})")
        print(f"  vnodes          {_ranges(s.vnodes) or 'none'}")
        print(f"  schema          {versions or 'not migrated'}")
        print(f"  deleted windows {s.windows}")
        for table, count in s.row_counts.items():
            print(f"  {table:<30} {count:>12,}")
    print(f"\nstorage nodes: {sum(n.alive for n in status.nodes)} alive of {len(status.nodes)}")
    for n in status.nodes:
        state = "alive" if n.alive else "SILENT"
        free = f"{(n.free_bytes or 0) / 2**30:,.1f} GiB free"
        blocks = "blocks not reported" if n.blocks is None else f"{n.blocks:,} blocks"
        print(f"  {n.shark:<24} {state:<7} {n.url}  {free}  {blocks}")
    return 0


# How long `db check --repair` waits for one repair's commit.
REPAIR_SECONDS = 10.0


def _db_check(config: Config, args: argparse.Namespace) -> int:
    """Exit 1 while a difference remains: found and not repaired (or its repair failed)."""

    async def check(store: MetadataStore) -> tuple[Check, list[str]]:
        found = await store.claims.check()
        if not args.repair:
            return found, []
        return found, [await _repaired(store, d) for d in found.differences]

    found, outcomes = _with_store(config, check)
    remaining = len(found.differences) - outcomes.count("repaired")
    if args.json:
        report = {
            "claims": found.claims,
            "buckets": found.buckets,
            "differences": [
                {**asdict(d), "repair": outcomes[i] if outcomes else None}
                for i, d in enumerate(found.differences)
            ],
        }
        print(json.dumps(report, indent=2, default=str))
        return 1 if remaining else 0
    print(
        f"{found.claims:,} bucket name(s) claimed, {found.buckets:,} bucket row(s): "
        f"{len(found.differences)} difference(s)"
    )
    for i, d in enumerate(found.differences):
        holder = "" if d.holder is None else f" (held by owner {d.holder[0]}, id {d.holder[1]})"
        outcome = f" [{outcomes[i]}]" if outcomes else ""
        print(f"  {d.kind}: {d.name} of owner {d.owner}, id {d.bucket_id}{holder}{outcome}")
    for kind in sorted({d.kind for d in found.differences}):
        print(f"{kind}: {EXPLANATIONS[kind]}")
    if found.differences and not args.repair:
        print("`shoal db check --repair` repairs what it can (docs/operations.md)")
    return 1 if remaining else 0


async def _repaired(store: MetadataStore, difference: Difference) -> str:
    """What a repair of `difference` came to: repaired, not repaired, or failed (why). A
    command runs no commit probe: each repair waits REPAIR_SECONDS at most for its commit."""
    try:
        async with asyncio.timeout(REPAIR_SECONDS):
            repaired = await store.claims.repair(difference)
    except MetadataError as exc:
        return f"failed: {exc}"
    except TimeoutError:
        return f"failed: no commit within {REPAIR_SECONDS:g} s (it may still commit)"
    return "repaired" if repaired else "not repaired"


def _db_dsn(config: Config, args: argparse.Namespace) -> int:
    """The one command that prints shards' passwords: its output is for psql, by the
    operator who can read the data directory (or the configuration) anyway."""
    with shard_configs(config) as shards:
        for shard in shards:
            print(shard.dsn)
    return 0


def _serve(config: Config, args: argparse.Namespace) -> int:
    from shoal import telemetry
    from shoal.cluster import LocalNodes, Ready, run_gateway

    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    config.data_dir.chmod(0o700)  # one made before data directories were private
    load_or_create_secret(config.secret_file)
    _warn_of_readable_secrets(config, args.config)
    port = config.s3.port if args.port is None else args.port
    admin_port = config.admin.port if args.admin_port is None else args.admin_port
    nodes = LocalNodes(config, _where(config, args))
    metrics = telemetry.folder_for(config.data_dir, "gateway")
    # The metrics folder is shared before any gateway worker or metric exists (telemetry.py).
    with (
        _serve_lock(config.data_dir),
        shard_configs(config, create=True, owner=True) as shards,
        telemetry.sharing(metrics),
    ):
        shoal.loop.run(migrate(shards, config.metadata))
        try:
            node_lines = nodes.start()

            def ready(gateway: Ready) -> None:
                show_root = " ".join(["shoal account show-root", *_where(config, args)])
                secret = gateway.root.secret_access_key if gateway.root_made_now else None
                _print_banner(
                    config,
                    gateway.port,
                    gateway.admin_port,
                    shards,
                    node_lines,
                    gateway.root.access_key_id,
                    secret,
                    show_root,
                )

            async def serve(stop: asyncio.Event) -> None:
                async with _supervised_postgres(config, stop):
                    await run_gateway(
                        config,
                        shards,
                        port,
                        stop,
                        on_ready=ready,
                        local_nodes=nodes,
                        admin_port=admin_port,
                        pipeline_args=_where(config, args),
                    )

            shoal.loop.run(_run_until_stopped(serve))
        finally:
            nodes.stop()
    print("Shoal stopped.", flush=True)
    return 0


def _warn_of_readable_secrets(config: Config, config_file: Path | None) -> None:
    """A warning for each file holding a secret that other users may read: Shoal makes its
    own 0600, but a secret file named in the configuration, or the configuration itself when
    its DSNs carry passwords, is the operator's."""
    files = [config.secret_file, config.credentials_key_file]
    if config_file is not None and any(
        conninfo_to_dict(shard.dsn).get("password") for shard in config.metadata.shards
    ):
        files.append(config_file)
    for path in files:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
                logging.getLogger("shoal").warning(
                    "%s holds a secret and other users may read it: chmod 600 it", path
                )


def _supervised_postgres(config: Config, stop: asyncio.Event) -> AbstractAsyncContextManager[None]:
    """`serve` restarts the embedded PostgreSQL if it dies; external shards are their
    operator's."""
    if not config.metadata.embedded:
        return contextlib.nullcontext()
    return embedded_server(config).supervised(stop)


def _print_banner(
    config: Config,
    port: int,
    admin_port: int,
    shards: list[ShardConfig],
    nodes: list[str],
    access_key_id: str,
    secret: str | None,
    show_root: str,
) -> None:
    """What `serve` prints once it is ready. The root secret once, and only when this start
    made it (the first start): a banner is read once but kept for long, in terminals'
    scrollback and service managers' logs; `show_root` is the command that prints it again."""
    endpoint = f"http://{config.s3.host}:{port}"
    shown_secret = secret if secret is not None else f"not shown again: `{show_root}` prints it"
    lines = [
        f"Shoal is running (data directory {config.data_dir})",
        f"  S3 endpoint        {endpoint}",
        f"  admin and console  http://{config.admin.host}:{admin_port}/console/"
        f" (token in {config.admin_token_file})",
        f"  access key id      {access_key_id}",
        f"  secret access key  {shown_secret}",
        *(f"  metadata shard     {shard.name}: {shard.shown_dsn}" for shard in shards),
        *(f"  storage node       {line}" for line in nodes),
        "Try:",
        f"  AWS_ACCESS_KEY_ID={access_key_id} AWS_SECRET_ACCESS_KEY=<secret access key> \\",
        f"    aws --endpoint-url {endpoint} s3 mb s3://my-bucket",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _storage_node(config: Config, args: argparse.Namespace) -> int:
    from shoal.cluster import NodeSettings, run_storage_node

    settings = NodeSettings(
        root=args.dir.absolute(),
        host=args.host,
        port=args.port,
        name=args.name,
        datacenter=args.datacenter,
        url=args.url,
        tls=config.storage.tls_cert is not None,
        admin_port=args.admin_port,
        capacity_bytes=args.capacity_bytes or config.storage.capacity_bytes,
        listen_fd=args.listen_fd,
        admin_listen_fd=args.admin_listen_fd,
    )
    if args.admin_listen_fd is not None and args.admin_port is None:
        raise CommandError("--admin-listen-fd needs --admin-port, the port it listens on")
    if not args.name.isidentifier() or not args.datacenter.isidentifier():
        raise CommandError("--name and --datacenter must be letters, digits and underscores")
    if args.capacity_bytes is not None and args.capacity_bytes < 1:
        raise CommandError("--capacity-bytes must be a positive number of bytes")
    with shard_configs(config) as shards:
        shoal.loop.run(
            _run_until_stopped(lambda stop: run_storage_node(config, shards, settings, stop))
        )
    return 0


async def _run_until_stopped(start: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a service until SIGINT or SIGTERM; a port already in use is one line, not a trace."""
    from shoal.workers import stop_on_signals

    try:
        await start(stop_on_signals())
    except OSError as exc:
        raise CommandError(str(exc)) from None


def _gc_run(config: Config, args: argparse.Namespace) -> int:
    from shoal.cluster import data_path
    from shoal.gc import Collector, connections_needed, parse_leeway

    try:
        leeway = parse_leeway(args.leeway) if args.leeway else config.gc.leeway
    except ValueError as exc:
        raise CommandError(str(exc)) from None

    async def run(store: MetadataStore) -> tuple[GcRun, list[int]]:
        path = data_path(config, store)
        try:
            collector = Collector(
                store, path, leeway, config.gc.batch_size, config.gc.workers, kind="cli"
            )
            return await collector.run_once(), collector.vnodes_skipped
        finally:
            await path.client.close()

    done, skipped = _with_store(config, run, connections_needed(config.gc.workers))
    print(
        f"reclaimed {done.records_reclaimed} of {done.records_found} records "
        f"({done.records_failed} failed), {done.blocks_deleted} block replicas deleted, "
        f"{done.bytes_reclaimed:,} bytes; dropped {done.windows_dropped} windows"
    )
    if skipped:
        print(f"left for a later run (being moved): vnode(s) {', '.join(map(str, skipped))}")
    return 0 if done.records_failed == 0 else 1


def _gc_status(config: Config, args: argparse.Namespace) -> int:
    async def gather(store: MetadataStore) -> tuple[bool, list[Backlog], list[GcRun]]:
        book = store.gc_book
        return await book.paused(), await book.backlog(), await book.last_runs()

    paused, backlog, runs = _with_store(config, gather)
    if args.json:
        print(
            json.dumps(
                {
                    "paused": paused,
                    "backlog": [b.__dict__ for b in backlog],
                    "runs": [r.__dict__ for r in runs],
                },
                indent=2,
                default=str,
            )
        )
        return 0
    print(f"gc daemon: {'PAUSED' if paused else 'running'}")
    print("backlog (deletion records, bytes, oldest):")
    for b in backlog:
        oldest = b.oldest.isoformat(timespec="seconds") if b.oldest else "-"
        estimate = "  (estimated)" if b.estimated else ""
        print(
            f"  {b.shard:<12} {b.records:>10,} records {b.bytes:>16,} bytes  oldest {oldest}"
            f"{estimate}"
        )
    print("last runs:")
    for r in runs:
        seconds = (r.finished - r.started).total_seconds()
        print(
            f"  {r.started:%Y-%m-%d %H:%M:%S} {r.kind:<6} found {r.records_found:,} "
            f"reclaimed {r.records_reclaimed:,} failed {r.records_failed:,} "
            f"block replicas deleted {r.blocks_deleted:,} windows dropped {r.windows_dropped} "
            f"in {seconds:.1f}s"
        )
    return 0


def _pipeline(config: Config, args: argparse.Namespace) -> int:
    from shoal.gc import parse_leeway
    from shoal.pipeline import JOBS, failure_line, run_job

    if args.job == "history":
        return _pipeline_history(config, args)
    if args.job not in JOBS:
        raise CommandError(f"unknown job {args.job!r}; jobs are {', '.join(JOBS)}")
    options: dict[str, object] = {"plot": args.plot, "repair": args.repair, "delete": args.delete}
    options |= {"bucket": args.bucket, "force": args.force}
    if args.leeway:
        try:
            options["leeway"] = parse_leeway(args.leeway)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    with shard_configs(config) as shards:
        try:
            summary = run_job(
                args.job, config, shards, master=args.master, output=args.output, options=options
            )
        except Exception as exc:  # Spark's errors are pages long; the log has the details
            if isinstance(exc, MetadataError):
                raise
            logging.getLogger("shoal.pipeline").debug("job failed", exc_info=exc)
            raise CommandError(f"pipeline {args.job} failed: {failure_line(exc)}") from None
    if args.json:
        print(
            json.dumps(
                {
                    "job": summary.job,
                    **summary.figures,
                    "output": str(summary.output),
                    "problems": summary.problems,
                },
                default=str,
            )
        )
    else:
        print(summary.table())
    return 1 if summary.problems else 0


def _pipeline_history(config: Config, args: argparse.Namespace) -> int:
    from shoal.admin.census import format_pipeline_runs, pipeline_run_json

    if args.limit < 1:
        raise CommandError("--limit must be 1 or more")
    runs = _with_store(config, lambda store: store.pipeline_runs.runs(args.history_job, args.limit))
    report = [pipeline_run_json(run) for run in runs]
    print(json.dumps(report, indent=2) if args.json else format_pipeline_runs(report))
    return 0


def _status(config: Config, args: argparse.Namespace) -> int:
    from shoal.admin.census import Census, format_status

    async def read(shards: list[ShardConfig]) -> dict[str, Any]:
        return await Census(config, shards).status()

    with shard_configs(config) as shards:
        report = shoal.loop.run(read(shards))
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    cluster = report["cluster"]
    return 0 if cluster["ready"] and not cluster["shards_not_committing"] else STATUS_NOT_READY


def _node_list(config: Config, args: argparse.Namespace) -> int:
    from shoal import node_admin

    deadline = config.storage.heartbeat_deadline

    async def read(store: MetadataStore) -> list[node_admin.NodeReport]:
        client = _block_client(config)
        try:
            return await node_admin.list_nodes(store, client, deadline)
        finally:
            await client.close()

    reports = _with_store(config, read)
    if args.json:
        rows = [
            {
                "shark": r.node.shark,
                "state": r.state,
                "alive": r.node.alive,
                "heartbeat": r.node.heartbeat.isoformat() if r.node.heartbeat else None,
                "free_bytes": r.node.free_bytes,
                "capacity_bytes": r.node.capacity_bytes,
                "blocks": r.blocks,
                "url": r.node.url,
            }
            for r in reports
        ]
        print(json.dumps(rows, indent=2))
    else:
        print(node_admin.format_nodes(reports))
    return 0


def _node_change(config: Config, args: argparse.Namespace) -> int:
    """`shoal node drain|undrain|mark-dead|remove NAME`: one line of what was done."""
    from shoal import node_admin

    deadline = config.storage.heartbeat_deadline

    async def change(store: MetadataStore) -> str:
        client = _block_client(config)
        try:
            if args.verb == "drain":
                node = await node_admin.drain(store, args.name, deadline)
                return (
                    f"node {node.shark} draining: it takes no new blocks; "
                    "`shoal pipeline rebalance` moves its copies to other nodes"
                )
            if args.verb == "undrain":
                node = await node_admin.undrain(store, args.name, deadline)
                return f"node {node.shark} active: it takes new blocks again"
            if args.verb == "mark-dead":
                dead = await node_admin.mark_dead(store, args.name, deadline)
                line = (
                    f"node {dead.node.shark} dead: {dead.noted} version(s) or part(s) noted for "
                    "re-replication from their other copies (by `shoal serve`, or "
                    "`shoal pipeline audit --repair`)"
                )
                if dead.sole:
                    line += f"; {dead.sole} had no other copy and still name it"
                return line
            node = await node_admin.remove(store, client, args.name, deadline)
            return f"node {node.shark} removed from the registry"
        except node_admin.NodeRefused as exc:
            raise CommandError(str(exc)) from None
        finally:
            await client.close()

    print(_with_store(config, change))
    return 0


def _block_client(config: Config) -> Any:
    from shoal.storage import BlockClient

    return BlockClient(load_or_create_secret(config.secret_file), tls_ca=config.storage.tls_ca)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _gc_pause(config: Config, paused: bool) -> int:
    _with_store(config, lambda store: store.gc_book.set_paused(paused))
    print("gc daemon paused" if paused else "gc daemon resumed")
    return 0


def _with_store(
    config: Config, action: Callable[[MetadataStore], Awaitable[T]], connections: int = 4
) -> T:
    """Run `action(store)` against the metadata tier (beside `shoal serve` or alone), with
    up to `connections` connections per shard (as many as `action` uses at once)."""

    async def run(shards: list[ShardConfig]) -> T:
        async with await MetadataStore.open(shards, connections) as store:
            return await action(store)

    with shard_configs(config) as shards:
        return shoal.loop.run(run(shards))


def _account_create(config: Config, args: argparse.Namespace) -> int:
    pair = _with_credentials(config, lambda c: c.create_account(args.name))
    _print_key(pair, args.json)
    return 0


def _key_add(config: Config, args: argparse.Namespace) -> int:
    async def add(credentials: Credentials) -> KeyPair:
        account = await credentials.store.accounts.get_by_name(args.name)
        return await credentials.add_key(account)

    _print_key(_with_credentials(config, add), args.json)
    return 0


def _key_revoke(config: Config, args: argparse.Namespace) -> int:
    _with_credentials(config, lambda c: c.store.keys.revoke(args.access_key_id))
    print(f"revoked {args.access_key_id}")
    return 0


def _show_root(config: Config, args: argparse.Namespace) -> int:
    from shoal.cluster import root_key

    _print_key(_with_credentials(config, root_key), args.json)
    return 0


def _account_list(config: Config, args: argparse.Namespace) -> int:
    async def listing(credentials: Credentials) -> list[str]:
        lines = []
        for account in await credentials.store.accounts.list():
            keys = await credentials.store.keys.list(account.id)
            active = [k.access_key_id for k in keys if k.revoked is None]
            lines.append(f"{account.name:<24} {account.id}  keys: {', '.join(active) or '-'}")
        return lines

    print("\n".join(_with_credentials(config, listing)))
    return 0


def _with_credentials(config: Config, action: Callable[[Credentials], Awaitable[T]]) -> T:
    """Run `action(credentials)` against the metadata tier (beside `shoal serve` or alone)."""
    key = load_encryption_key(config.credentials_key_file)
    return _with_store(config, lambda store: action(Credentials(store, key)))


def _print_key(pair: KeyPair, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "account": pair.account.name,
                    "account_id": str(pair.account.id),
                    "access_key_id": pair.access_key_id,
                    "secret_access_key": pair.secret_access_key,
                }
            )
        )
        return
    print(f"account            {pair.account.name} ({pair.account.id})")
    print(f"access key id      {pair.access_key_id}")
    print(f"secret access key  {pair.secret_access_key}")


def _where(config: Config, args: argparse.Namespace) -> list[str]:
    """The --config/--data-dir arguments that make a child process see this configuration."""
    if args.config is None:
        return ["--data-dir", str(config.data_dir)]
    if args.data_dir is None:
        return ["--config", str(args.config.absolute())]
    return ["--config", str(args.config.absolute()), "--data-dir", str(config.data_dir)]


@contextlib.contextmanager
def _serve_lock(data_dir: Path) -> Iterator[None]:
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
    command()
