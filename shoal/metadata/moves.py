"""Shards join the metadata tier and vnodes move between shards, online.

`add_shard` migrates a new shard and lists it in the catalog (its DSN sealed with the
credentials key); the ring does not change. `Mover.move` moves one vnode:

  held       on the source, the mover takes the vnode's move lock (queries.VNODE_MOVE_LOCK),
             waiting up to GC_WAIT for the GC transactions in flight on the vnode; from then
             until the switch (or the roll-back) GC leaves the vnode alone, so it neither
             holds up the fence nor truncates or drops a window, which logical replication
             would not carry to the copy. A crashed mover's lock goes with its connection.
  copying    the target gets the vnode's schema (the vnode migrations and the deleted
             tables' windows); the source publishes the schema's tables and the target
             subscribes: PostgreSQL's logical replication copies the tables in bulk (COPY)
             while the source keeps serving, then streams the changes made meanwhile.
  fenced     on the source, in one transaction: lock the vnode's tables (waits for the
             writes in flight, holds back new ones), rename the schema to
             `moved_manta_bucket_<vnode>_m<move id>`. From its commit on, every statement
             that names the vnode on the source fails (outage.py: VnodeMoved), prepared
             ones included, and its caller follows the ring.
  caught up  the subscription has applied everything up to the fence's WAL position (it
             caught up once before the fence too, so the fence waits for little).
  switched   a new ring version places the vnode on the target, in the same catalog
             transaction that records the step; the subscription and publication go.
  done       after a grace period, the source's renamed copy is dropped (`finish`).

The write pause of the vnode is fenced -> switched. Each step is recorded in
`shoal.vnode_move`, but what a rerun does after a crash is decided by the databases' state,
which every step changes atomically (`recover`): before the fence (the source still holds
`manta_bucket_<vnode>`) the target's copy and the replication are dropped; after the fence
and before the switch, the move finishes if the target caught up, else the source's schema
is renamed back; after the switch, the replication is dropped. At no moment do two schemas
named `manta_bucket_<vnode>` take writes for one ring version: the target's copy takes
writes only once a ring version names it, and by then the source's copy is renamed.

A copy must not come back to a shard while processes may still use a ring version that
placed the vnode there: a move onto a shard that still holds the vnode's renamed copy is
refused until `finish` dropped it, which it does only after the grace period (much longer
than RING_POLL_SECONDS) and once every live process has noted that it loaded the ring
version of the move (LIVE_READER).

SHOAL_MOVE_FAULT_AT=<step> makes the mover kill itself (SIGKILL) right after that step, for
the fault tests: copying, synced, fenced, caught_up, switched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import queries
from shoal.metadata.errors import MetadataError
from shoal.metadata.migrate import (
    apply_migrations,
    connect_shard,
    store_setting,
)
from shoal.metadata.partitions import (
    WINDOW_SETTING,
    create_window,
    ensure_windows,
    window_end,
    window_width,
)
from shoal.metadata.ring import MOVED_COPY_PREFIX, Ring, vnode_schema
from shoal.metadata.schema import SHARD_MIGRATIONS, VNODE_MIGRATIONS
from shoal.metadata.shards import RING_POLL_SECONDS, read_ring
from shoal.sealing import seal

MOVER_LOCK = 0x5340A2  # advisory lock key: one mover at a time
FAULT_ENV = "SHOAL_MOVE_FAULT_AT"
FAULT_STEPS = ("copying", "synced", "fenced", "caught_up", "switched")
DEFAULT_GRACE = timedelta(minutes=5)
# Shorter grace periods are raised to this: every process reads the ring at least every
# RING_POLL_SECONDS, so past it none still sends the vnode's statements to the old shard.
MIN_GRACE = timedelta(seconds=2 * RING_POLL_SECONDS + 1)
# The grace is enforced too: a process notes the ring version it loaded at every poll
# (shards.ShardSet, shoal.ring_reader), and an old copy is dropped only once every process
# noted within LIVE_READER has loaded the move's version; one not noted for that long is
# gone (or cannot reach the catalog, and then serves nothing). `finish` waits up to
# READERS_WAIT_SECONDS for those behind, a poll and a half.
LIVE_READER = timedelta(seconds=3 * RING_POLL_SECONDS)
READERS_WAIT_SECONDS = 1.5 * RING_POLL_SECONDS + 1
# The fence waits this long for the writes in flight on the vnode's tables, and is tried
# this many times (a long listing holds them too), a moment apart, before the move gives up.
# Statements of the vnode queue behind the fence's lock while it waits: each try costs them
# up to FENCE_LOCK_TIMEOUT.
FENCE_LOCK_TIMEOUT = "300ms"
FENCE_ATTEMPTS = 10
FENCE_RETRY_SECONDS = 0.1
# The fence locks the vnode's tables one by one, and a write that has locked one of them may
# wait for another the fence holds: the fence checks for such a deadlock long before the
# write would (PostgreSQL's deadlock_timeout, 1 s by default), so that it is the fence that
# gives way and tries again, never a client's write.
FENCE_DEADLOCK_TIMEOUT = "20ms"
# How long the target may take to apply the last changes after the fence; past it, the
# fence is lifted (the source's schema renamed back) rather than keep the vnode paused.
CATCH_UP_SECONDS = 10.0
# How long the mover waits for the GC transactions in flight on the vnode (a claimed batch
# whose blocks are being deleted) before it gives the move up.
GC_WAIT = "30s"
# A logical replication slot is made once every transaction that writes on the source's
# server has ended (it waits on their ids, a lock wait): a transaction left open would hold
# the move forever, so the mover waits this long and then gives the move up, in one line.
SLOT_WAIT = "60s"
POLL_SECONDS = 0.005
DROP_SLOT_SECONDS = 10.0


class MoveError(MetadataError):
    """A shard could not be added, or a vnode could not be moved (said in one line)."""


def _still_in_grace(moves: list[MoveRecord], grace: timedelta) -> str:
    """What an operator is told of the old copies kept for their grace period."""
    soonest = min(move.updated for move in moves) + grace - datetime.now(UTC)
    vnodes = ", ".join(str(move.vnode) for move in moves)
    return (
        f"vnode(s) {vnodes}: old copies kept for the grace period ({grace.total_seconds():g} s "
        f"after the switch; the first ends in {max(0, round(soonest.total_seconds()))} s): "
        "`shoal ring move --finish` drops them then"
    )


@dataclass(frozen=True)
class MoveRecord:
    id: int
    vnode: int
    source: str
    target: str
    step: str
    fence_lsn: str | None
    ring_version: int | None
    write_pause_seconds: float | None
    started: datetime
    updated: datetime
    grace_over: bool = False


@dataclass(frozen=True)
class MoveResult:
    vnode: int
    source: str
    target: str
    ring_version: int
    copy_seconds: float  # start -> the target's copy caught up with the source
    write_pause_seconds: float  # fence -> switch: the vnode's writes (and reads) waited


async def add_shard(
    catalog: ShardConfig, shard: ShardConfig, key: bytes, config: MetadataConfig
) -> None:
    """Migrate `shard` (no vnodes yet: the ring does not change) and list it in the catalog,
    its DSN sealed with `key`."""
    if not shard.name.replace("_", "").replace("-", "").isalnum():
        raise MoveError(f"shard name {shard.name!r}: use letters, digits, '-' and '_'")
    conn = await connect_shard(shard)
    try:
        await apply_migrations(conn, "shard", SHARD_MIGRATIONS)
        async with await connect_shard(catalog) as catalog_conn:
            width = await window_width(catalog_conn)
            ring = await read_ring(catalog_conn)
            if shard.name in ring.shards and shard.name != catalog.name:
                raise MoveError(f"shard {shard.name} already holds vnodes")
            await store_setting(conn, WINDOW_SETTING, str(int(width.total_seconds())))
            await catalog_conn.execute(
                queries.ADD_SHARD,
                {"name": shard.name, "dsn_sealed": seal(key, shard.name, shard.dsn)},
            )
    finally:
        await conn.close()


def plan_rebalance(ring: Ring, shards: Sequence[str]) -> list[tuple[int, str]]:
    """The moves (vnode, target shard) that leave every shard of `shards` with the same
    number of vnodes, give or take one; as few as can be, the highest vnodes of the fullest
    shards first."""
    if not shards:
        return []
    held = {name: ring.vnodes_of(name) for name in shards}
    for name in ring.shards:  # a shard left out of `shards` gives all its vnodes away
        held.setdefault(name, ring.vnodes_of(name))
    base, extra = divmod(ring.vnodes, len(shards))
    # The shards that already hold the most keep the extra vnodes: fewer moves.
    by_size = sorted(shards, key=lambda name: (-len(held[name]), name))
    goal = {name: base + (1 if index < extra else 0) for index, name in enumerate(by_size)}
    surplus = [v for name in held for v in held[name][goal.get(name, 0) :]]
    moves = []
    for name in sorted(shards, key=lambda n: len(held[n])):
        while len(held[name]) < goal[name] and surplus:
            vnode = surplus.pop()
            held[name].append(vnode)
            moves.append((vnode, name))
    return moves


class Mover:
    """Moves vnodes; one at a time across the cluster (an advisory lock on the catalog).

    `shards`: every shard, configured and added, the catalog first (deployment.shard_configs).
    """

    def __init__(
        self,
        shards: Sequence[ShardConfig],
        config: MetadataConfig,
        grace: timedelta = DEFAULT_GRACE,
    ) -> None:
        self.configs = {shard.name: shard for shard in shards}
        self.catalog_name = shards[0].name
        self.config = config
        self.grace = max(grace, MIN_GRACE)
        self._conns: dict[str, psycopg.AsyncConnection[Any]] = {}
        self._locked = False

    async def __aenter__(self) -> Mover:
        catalog = await self._conn(self.catalog_name)
        row = await (await catalog.execute(queries.TRY_MOVER_LOCK, {"key": MOVER_LOCK})).fetchone()
        if not row or not row[0]:
            await self.close()
            raise MoveError("another `shoal ring move` is running")
        self._locked = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        catalog = self._conns.get(self.catalog_name)
        if self._locked and catalog is not None and not catalog.closed:
            # Let go at once: a closed connection's backend lets go of its locks only when
            # it notices, and the next mover may come first.
            with contextlib.suppress(psycopg.Error):
                await catalog.execute(queries.MOVER_UNLOCK, {"key": MOVER_LOCK})
        self._locked = False
        for conn in self._conns.values():
            await conn.close()
        self._conns.clear()

    # -- what the CLI calls ------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """Resume or roll back every move a crashed mover left unfinished; drop what a
        switched move left of its replication. Returns a line for each."""
        said = []
        for move in await self._moves(queries.OPEN_MOVES):
            said.append(await self._recover(move))
        for move in await self._moves(queries.SWITCHED_MOVES, grace=self.grace):
            await self._unsubscribe(move)
        return said

    async def finish(self, *, now: bool = False) -> list[str]:
        """Drop the source copies of switched moves whose grace period is over (all of them
        with `now`, which tests use) and whose ring version every live process has loaded
        (waiting up to READERS_WAIT_SECONDS for those behind)."""
        said = []
        # One wait for the processes behind, however many moves are due.
        deadline = time.monotonic() + READERS_WAIT_SECONDS
        in_grace = []
        for move in await self._moves(queries.SWITCHED_MOVES, grace=self.grace):
            if not (move.grace_over or now):
                in_grace.append(move)
                continue
            behind = await self._readers_behind(move, deadline)
            if behind:
                said.append(
                    f"vnode {move.vnode}: its old copy on shard {move.source} stays: "
                    f"{len(behind)} process(es) still use a ring older than version "
                    f"{move.ring_version} ({', '.join(behind[:3])})"
                )
                continue
            await self._unsubscribe(move)
            source = await self._conn(move.source)
            moved = _moved_schema(move)
            async with source.transaction():
                await source.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(moved))
                )
                await source.execute(queries.FORGET_MIGRATION_SCOPE, {"scope": moved})
                await source.execute(queries.FORGET_VNODE_DIRECTORY, {"vnode": move.vnode})
            await self._step(move.id, "done")
            said.append(f"vnode {move.vnode}: dropped its old copy on shard {move.source}")
        if in_grace:
            said.append(_still_in_grace(in_grace, self.grace))
        return said

    async def move(self, vnode: int, target: str) -> MoveResult | None:
        """Move `vnode` to shard `target` (None: it is there already)."""
        ring = await self._ring()
        if not 0 <= vnode < ring.vnodes:
            raise MoveError(f"vnode {vnode}: the ring has vnodes 0 to {ring.vnodes - 1}")
        if target not in self.configs:
            raise MoveError(f"unknown shard {target!r}: add it with `shoal shard add`")
        source = ring.shard_of(vnode)
        if source == target:
            return None
        await self._refuse_recent_copy(vnode, target)
        if (await self._one(source, queries.WAL_LEVEL)) != "logical":
            raise MoveError(
                f"shard {source} runs with wal_level other than logical: a vnode moves by "
                "logical replication (set wal_level = logical and restart it)"
            )
        started = time.monotonic()
        catalog = await self._conn(self.catalog_name)
        try:
            cur = await catalog.execute(
                queries.START_MOVE, {"vnode": vnode, "source": source, "target": target}
            )
        except psycopg.errors.UniqueViolation:
            raise MoveError(f"vnode {vnode} is already moving") from None
        row = await cur.fetchone()
        assert row is not None
        move = (await self._moves(queries.RECENT_MOVES, limit=1))[0]
        assert move.id == row[0]
        try:
            await self._hold_vnode(move)
            await self._copy(move)
            _fault("copying")
            await self._wait_synced(move)
            # Catch up with the writes made during the copy while the source still serves,
            # so that the fence waits only for the last moments' worth.
            await self._caught_up(move, await self._one(source, queries.CURRENT_LSN), 3600.0)
            _fault("synced")
            copied = time.monotonic() - started
            pause_started = time.monotonic()
            lsn = await self._fence(move)
            _fault("fenced")
            if not await self._caught_up(move, lsn, CATCH_UP_SECONDS):
                raise MoveError(f"vnode {vnode}: the target did not catch up after the fence")
            _fault("caught_up")
            pause = time.monotonic() - pause_started
            version = await self._switch(move, pause)
            pause = time.monotonic() - pause_started
        except MoveError:
            await self._roll_back(move)
            raise
        finally:
            await self._let_go(move)
        _fault("switched")
        await self._unsubscribe(move)
        return MoveResult(vnode, source, target, version, copied, pause)

    async def status(self, limit: int = 10) -> tuple[Ring, list[dict[str, Any]], list[MoveRecord]]:
        """The ring, its latest versions, and the latest moves."""
        catalog = await self._conn(self.catalog_name)
        cur = catalog.cursor(row_factory=dict_row)
        await cur.execute(queries.RING_VERSIONS, {"limit": limit})
        versions = await cur.fetchall()
        return await self._ring(), versions, await self._moves(queries.RECENT_MOVES, limit=limit)

    async def remove_shard(self, name: str) -> None:
        """Forget a shard that `shoal shard add` added, once nothing of the ring is on it: it
        holds no vnode, no move from or to it is open, and no moved vnode's old copy on it
        awaits its grace period. Its database is left as it is, for the operator to drop."""
        if name == self.catalog_name:
            raise MoveError(f"shard {name} holds the catalog: it cannot be removed")
        ring = await self._ring()
        if name not in self.configs:
            raise MoveError(f"unknown shard {name!r}")
        held = ring.vnodes_of(name)
        if held:
            raise MoveError(
                f"shard {name} holds {len(held)} vnode(s): move them away first "
                f"(`shoal shard drain {name}`)"
            )
        pending = await self._moves(queries.MOVES_OF_SHARD, name=name)
        if pending:
            move = pending[0]
            raise MoveError(
                f"vnode {move.vnode}'s move {move.source} -> {move.target} is not over "
                f"({move.step}): finish it first (`shoal ring move --finish`)"
            )
        catalog = await self._conn(self.catalog_name)
        removed = await catalog.execute(queries.REMOVE_SHARD, {"name": name})
        if removed.rowcount == 0:
            raise MoveError(
                f"shard {name} is in the configuration file, not added by `shoal shard add`: "
                "remove it there"
            )

    # -- the steps ---------------------------------------------------------------------------

    async def _hold_vnode(self, move: MoveRecord) -> None:
        """Take the vnode's move lock on the source: GC leaves the vnode alone from now on,
        and the GC transactions in flight on it are over."""
        source = await self._conn(move.source)
        try:
            async with source.transaction():  # the lock is the session's: it outlives this
                await source.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(GC_WAIT))
                )
                await source.execute(queries.VNODE_MOVE_LOCK, {"vnode": move.vnode})
        except psycopg.errors.LockNotAvailable:
            raise MoveError(
                f"vnode {move.vnode}: garbage collection kept it busy for {GC_WAIT}"
            ) from None

    async def _let_go(self, move: MoveRecord) -> None:
        """Release the vnode's move lock (GC on the source finds the vnode gone from now on,
        and follows the ring to its new shard)."""
        source = self._conns.get(move.source)
        if source is not None and not source.closed:
            with contextlib.suppress(psycopg.Error):
                await source.execute(queries.VNODE_MOVE_UNLOCK, {"vnode": move.vnode})

    async def _copy(self, move: MoveRecord) -> None:
        """The target's schema, the source's publication and slot, the target's subscription
        (whose first act is to COPY every table)."""
        source, target = await self._conn(move.source), await self._conn(move.target)
        schema = vnode_schema(move.vnode)
        width = await window_width(source)
        await self._drop_target_copy(move)  # a copy a rolled-back move may have left
        await apply_migrations(target, schema, VNODE_MIGRATIONS, schema)
        # The same windows on both sides, and enough ahead that none is made during the move.
        ahead = self.config.partitions_ahead + 1
        await ensure_windows(source, [move.vnode], width, ahead)
        for table, window in await self._windows(source, schema):
            end = window_end(window, width)
            if end is not None:
                await create_window(target, schema, table, end - width, width)
            # Windows made before windows had a replica identity (partitions.py).
            await source.execute(
                sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                    sql.Identifier(schema), sql.Identifier(window)
                )
            )
        await ensure_windows(target, [move.vnode], width, ahead)
        # Published through their partitioned parents (publish_via_partition_root), the
        # deleted tables' changes carry the parents' replica identity: without FULL, a
        # DELETE of a record (GC reclaiming it during the move) stops the subscription.
        for table, partitioned, _ in await self._tables(source, schema):
            if partitioned:
                await source.execute(
                    sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                        sql.Identifier(schema), sql.Identifier(table)
                    )
                )
        name = _replication_name(move)
        # TRUNCATE is not published: GC truncates only windows it has reclaimed in full,
        # and never while the mover holds the vnode (_hold_vnode).
        await source.execute(
            sql.SQL(
                "CREATE PUBLICATION {} FOR TABLES IN SCHEMA {} "
                "WITH (publish_via_partition_root = true, publish = 'insert, update, delete')"
            ).format(sql.Identifier(name), sql.Identifier(schema))
        )
        # Made here, not by CREATE SUBSCRIPTION: that one waits for every transaction of its
        # server to end, its own included, when source and target share a server.
        await self._create_slot(move, name)
        await target.execute(
            sql.SQL(
                "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} "
                "WITH (create_slot = false, slot_name = {})"
            ).format(
                sql.Identifier(name),
                sql.Literal(self.configs[move.source].dsn),
                sql.Identifier(name),
                sql.Literal(name),
            )
        )

    async def _create_slot(self, move: MoveRecord, name: str) -> None:
        source = await self._conn(move.source)
        try:
            async with source.transaction():
                await source.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(SLOT_WAIT))
                )
                await source.execute(queries.CREATE_SLOT, {"slot": name})
        except psycopg.errors.LockNotAvailable:
            raise MoveError(
                f"vnode {move.vnode}: a transaction on shard {move.source}'s server stayed "
                f"open for {SLOT_WAIT} and kept the copy from starting (see pg_stat_activity)"
            ) from None

    async def _wait_synced(self, move: MoveRecord, timeout: float = 3600.0) -> None:
        """Until every table's initial copy is done and caught up with the stream."""
        name = {"name": _replication_name(move)}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tables = await self._one(move.target, queries.SUBSCRIPTION_TABLES, name)
            unsynced = await self._one(move.target, queries.SUBSCRIPTION_UNSYNCED, name)
            if tables and not unsynced:
                return
            await self._check_subscription(move)
            await asyncio.sleep(0.05)
        raise MoveError(f"vnode {move.vnode}: the copy did not finish in {timeout:g} s")

    async def _fence(self, move: MoveRecord) -> str:
        """Lock the vnode's tables on the source and rename its schema, in one transaction;
        the WAL position after it."""
        source = await self._conn(move.source)
        schema = vnode_schema(move.vnode)
        moved = _moved_schema(move)
        tables = [
            t for t, partitioned, is_window in await self._tables(source, schema) if not is_window
        ]
        lock = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.SQL(", ").join(sql.Identifier(schema, table) for table in tables)
        )
        for attempt in range(FENCE_ATTEMPTS):
            try:
                async with source.transaction():
                    await source.execute(
                        sql.SQL("SET LOCAL lock_timeout = {}").format(
                            sql.Literal(FENCE_LOCK_TIMEOUT)
                        )
                    )
                    await source.execute(
                        sql.SQL("SET LOCAL deadlock_timeout = {}").format(
                            sql.Literal(FENCE_DEADLOCK_TIMEOUT)
                        )
                    )
                    await source.execute(lock)
                    await source.execute(
                        sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                            sql.Identifier(schema), sql.Identifier(moved)
                        )
                    )
                    await source.execute(
                        queries.RENAME_MIGRATION_SCOPE, {"old": schema, "new": moved}
                    )
                break
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                if attempt == FENCE_ATTEMPTS - 1:
                    raise MoveError(
                        f"vnode {move.vnode}: its tables stayed busy; no write fence"
                    ) from None
                await asyncio.sleep(FENCE_RETRY_SECONDS)
        lsn = await self._one(move.source, queries.CURRENT_LSN)
        await self._step(move.id, "fenced", fence_lsn=lsn)
        return str(lsn)

    async def _caught_up(self, move: MoveRecord, lsn: str, timeout: float) -> bool:
        """Whether the target applied the source's changes up to `lsn` within `timeout`."""
        slot = {"slot": _replication_name(move), "lsn": lsn}
        deadline = time.monotonic() + timeout
        checked = time.monotonic()
        while True:
            if await self._one(move.source, queries.SLOT_CONFIRMED, slot):
                return True
            if time.monotonic() >= deadline:
                return False
            if time.monotonic() - checked > 1.0:
                await self._check_subscription(move)
                checked = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)

    async def _check_subscription(self, move: MoveRecord) -> None:
        """MoveError if the move's subscription keeps failing (it would retry for ever)."""
        name = {"name": _replication_name(move)}
        if await self._one(move.target, queries.SUBSCRIPTION_ERRORS, name):
            raise MoveError(
                f"vnode {move.vnode}: copying to shard {move.target} fails (its server log "
                "says why)"
            )

    async def _switch(self, move: MoveRecord, pause: float) -> int:
        """A new ring version with the vnode on the target, and the move's step, at once."""
        catalog = await self._conn(self.catalog_name)
        async with catalog.transaction():
            row = await (await catalog.execute(queries.NEXT_RING)).fetchone()
            assert row is not None
            version = int(row[0])
            await catalog.execute(
                queries.COPY_RING_VNODES,
                {"version": version, "vnode": move.vnode, "shard": move.target},
            )
            await catalog.execute(
                queries.MOVE_STEP,
                _step_params(move.id, "switched", ring_version=version, write_pause_seconds=pause),
            )
        return version

    async def _unsubscribe(self, move: MoveRecord) -> None:
        """Drop the subscription (and with it its slots on the source) and the publication.
        Each part only if it is there: run again after a crash, it finishes the job."""
        name = _replication_name(move)
        target, source = await self._conn(move.target), await self._conn(move.source)
        if await self._one(move.target, queries.SUBSCRIPTION_EXISTS, {"name": name}):
            await target.execute(
                sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(name))
            )
            await self._wait_slot_idle(move.source, name)
            await target.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(name)))
        if await self._one(move.source, queries.SLOT_EXISTS, {"slot": name}):
            await self._wait_slot_idle(move.source, name)
            await source.execute(queries.DROP_SLOT, {"slot": name})
        await source.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))

    async def _wait_slot_idle(self, shard: str, slot: str) -> None:
        """Until no walsender uses the slot (a disabled subscription's worker takes a moment
        to stop)."""
        deadline = time.monotonic() + DROP_SLOT_SECONDS
        while time.monotonic() < deadline:
            active = await self._one(shard, queries.SLOT_ACTIVE, {"slot": slot})
            if not active:
                return
            await asyncio.sleep(0.02)

    async def _roll_back(self, move: MoveRecord) -> None:
        """Undo a move that did not switch: the source's schema gets its name back (if the
        fence renamed it), the replication and the target's copy go."""
        source = await self._conn(move.source)
        schema, moved = vnode_schema(move.vnode), _moved_schema(move)
        if not await self._has_schema(move.source, schema) and await self._has_schema(
            move.source, moved
        ):
            async with source.transaction():
                await source.execute(
                    sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                        sql.Identifier(moved), sql.Identifier(schema)
                    )
                )
                await source.execute(queries.RENAME_MIGRATION_SCOPE, {"old": moved, "new": schema})
        await self._unsubscribe(move)
        await self._drop_target_copy(move)
        await self._step(move.id, "rolled_back")

    async def _recover(self, move: MoveRecord) -> str:
        ring = await self._ring()
        schema, moved = vnode_schema(move.vnode), _moved_schema(move)
        if ring.shard_of(move.vnode) == move.target:  # cannot happen: switch records its step
            await self._unsubscribe(move)
            await self._step(move.id, "switched")
            return f"vnode {move.vnode}: move {move.id} had switched; cleaned up"
        if await self._has_schema(move.source, schema):
            await self._roll_back(move)
            return f"vnode {move.vnode}: move {move.id} to {move.target} rolled back (not fenced)"
        if not await self._has_schema(move.source, moved):
            raise MoveError(
                f"vnode {move.vnode}: shard {move.source} holds neither {schema} nor {moved}; "
                "repair by hand"
            )
        lsn = move.fence_lsn or str(await self._one(move.source, queries.CURRENT_LSN))
        name = _replication_name(move)
        subscribed = await self._one(move.target, queries.SUBSCRIPTION_EXISTS, {"name": name})
        try:
            caught_up = bool(subscribed) and await self._caught_up(move, lsn, CATCH_UP_SECONDS)
        except MoveError:  # the subscription fails: it will not catch up
            caught_up = False
        if caught_up:
            version = await self._switch(move, 0.0)
            await self._unsubscribe(move)
            return f"vnode {move.vnode}: move {move.id} finished (ring version {version})"
        await self._roll_back(move)
        return f"vnode {move.vnode}: move {move.id} to {move.target} rolled back (after fence)"

    # -- helpers -----------------------------------------------------------------------------

    async def _refuse_recent_copy(self, vnode: int, target: str) -> None:
        pattern = f"moved\\_{vnode_schema(vnode)}\\_m%".replace(
            "manta_bucket_", "manta\\_bucket\\_"
        )
        target_conn = await self._conn(target)
        cur = await target_conn.execute(queries.SCHEMAS_LIKE, {"pattern": pattern})
        if await cur.fetchall():
            raise MoveError(
                f"shard {target} still holds vnode {vnode}'s copy from an earlier move; it is "
                "dropped after the grace period (`shoal ring move --finish`)"
            )

    async def _readers_behind(self, move: MoveRecord, deadline: float) -> list[str]:
        """The live processes (noted within LIVE_READER) that have not loaded the move's
        ring version, after waiting until `deadline` (monotonic) for them to."""
        catalog = await self._conn(self.catalog_name)
        while True:
            params = {"live": LIVE_READER, "version": move.ring_version}
            try:
                cur = await catalog.execute(queries.RING_READERS_BEHIND, params)
            except psycopg.errors.UndefinedTable:
                raise MoveError(
                    "the catalog predates this version of Shoal: run `shoal db migrate`"
                ) from None
            behind = [str(row[0]) for row in await cur.fetchall()]
            if not behind or time.monotonic() >= deadline:
                return behind
            await asyncio.sleep(0.1)

    async def _drop_target_copy(self, move: MoveRecord) -> None:
        ring = await self._ring()
        if ring.shard_of(move.vnode) == move.target:
            raise MoveError(f"vnode {move.vnode} is on shard {move.target}: not dropping it")
        target = await self._conn(move.target)
        schema = vnode_schema(move.vnode)
        async with target.transaction():
            await target.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
            await target.execute(queries.FORGET_MIGRATION_SCOPE, {"scope": schema})
            await target.execute(queries.FORGET_VNODE_DIRECTORY, {"vnode": move.vnode})

    async def _windows(
        self, conn: psycopg.AsyncConnection[Any], schema: str
    ) -> list[tuple[str, str]]:
        """(deleted table, window) of each window in `schema`."""
        return [
            (name.rsplit("_w", 1)[0], name)
            for name, _, is_window in await self._tables(conn, schema)
            if is_window
        ]

    async def _tables(
        self, conn: psycopg.AsyncConnection[Any], schema: str
    ) -> list[tuple[str, bool, bool]]:
        cur = await conn.execute(queries.SCHEMA_TABLES, {"schema": schema})
        return [
            (name, partitioned, is_window) for name, partitioned, is_window in await cur.fetchall()
        ]

    async def _has_schema(self, shard: str, schema: str) -> bool:
        return bool(await self._one(shard, queries.SCHEMA_EXISTS, {"schema": schema}))

    async def _ring(self) -> Ring:
        return await read_ring(await self._conn(self.catalog_name))

    async def _moves(self, statement: str, **params: Any) -> list[MoveRecord]:
        catalog = await self._conn(self.catalog_name)
        cur = catalog.cursor(row_factory=dict_row)
        await cur.execute(statement, params)
        return [MoveRecord(**row) for row in await cur.fetchall()]

    async def _step(self, move_id: int, step: str, **values: Any) -> None:
        catalog = await self._conn(self.catalog_name)
        await catalog.execute(queries.MOVE_STEP, _step_params(move_id, step, **values))

    async def _one(self, shard: str, statement: str, params: dict[str, Any] | None = None) -> Any:
        conn = await self._conn(shard)
        row = await (await conn.execute(statement, params)).fetchone()
        return row[0] if row else None

    async def _conn(self, shard: str) -> psycopg.AsyncConnection[Any]:
        conn = self._conns.get(shard)
        if conn is None or conn.closed:
            conn = await connect_shard(self.configs[shard])
            self._conns[shard] = conn
        return conn


def _step_params(move_id: int, step: str, **values: Any) -> dict[str, Any]:
    return {
        "id": move_id,
        "step": step,
        "fence_lsn": values.get("fence_lsn"),
        "ring_version": values.get("ring_version"),
        "write_pause_seconds": values.get("write_pause_seconds"),
    }


def _replication_name(move: MoveRecord) -> str:
    """The move's publication, slot and subscription."""
    return f"shoal_move_{move.id}"


def _moved_schema(move: MoveRecord) -> str:
    """What the fence renames the source's vnode schema to."""
    return f"{MOVED_COPY_PREFIX}{vnode_schema(move.vnode)}_m{move.id}"


def _fault(step: str) -> None:
    """Die here as `kill -9` would, when SHOAL_MOVE_FAULT_AT names this step (fault tests)."""
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
