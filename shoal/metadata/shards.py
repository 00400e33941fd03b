"""The shards of the metadata tier: one connection pool each, and the ring that places vnodes.

Statements are written once with a `{schema}` placeholder (queries.py); this module renders
them per vnode, and composes the per-shard statements that read every vnode of a shard in one
round trip (`arms` joined by UNION ALL).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg.types import TypeInfo
from psycopg.types.hstore import register_hstore
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from shoal.config import ShardConfig
from shoal.metadata import queries
from shoal.metadata.batched import ReadBatcher, WriteBatcher
from shoal.metadata.bucket_cache import BucketCache
from shoal.metadata.errors import CommitUnknown, MetadataError, MetadataUnavailable, SchemaError
from shoal.metadata.outage import classified, connection_failed
from shoal.metadata.ring import MOVED_COPY_PREFIX, Ring, vnode_schema
from shoal.metadata.schema import (
    CATALOG_MIGRATIONS,
    SHARD_MIGRATIONS,
    VNODE_MIGRATIONS,
    Migration,
)
from shoal.sealing import SealBroken, unseal

log = logging.getLogger("shoal.metadata")
# psycopg_pool warns at every failed connect: while a shard is down, a few every PROBE_SECONDS
# from each pool. ShardPool says once when a shard goes down and when it is back.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

# Statements are rendered per vnode, so a connection sees up to (vnodes x statements) texts;
# keep them all prepared.
PREPARED_STATEMENTS_PER_CONNECTION = 4096
MIN_SERVER_VERSION = 180000  # RETURNING OLD (see queries.py) needs PostgreSQL 18
UPPER_BOUND = "AND name < %(upper)s"
# How long a call waits for a pooled connection before it is refused (MetadataUnavailable,
# a 503): a request never hangs on the pool (psycopg_pool's own default is 30 s).
CONNECTION_WAIT_SECONDS = 1.0
# While a shard is down: how often it is tried again with a real connect, and how long one try
# may take. The pool refills its connections at the same pace, not with psycopg_pool's
# doubling delays, which could leave it empty for many seconds after the shard came back.
PROBE_SECONDS = 0.2
PROBE_TIMEOUT_SECONDS = 1.0
# A commit probe out this long finds the shard's commits hung (ShardPool.probe_commits): a
# commit is a WAL flush, milliseconds on a well disk; seconds, and a synchronous standby or
# the WAL's disk does not answer.
COMMIT_STALL_SECONDS = 2.0
# The warning of a commit whose wait for a synchronous standby was cancelled (PostgreSQL's
# syncrep.c; in English, as the server's lc_messages is by default).
SYNC_WAIT_CANCELLED = "canceling wait for synchronous replication"
# A DSN without a connect_timeout gets this one (seconds; libpq's smallest is 2).
CONNECT_TIMEOUT_SECONDS = 2
# How often every process reads the ring version, to follow vnode moves without waiting for
# a statement to be refused; and how often a caller refused by a vnode in the middle of its
# switch reads it again.
RING_POLL_SECONDS = 2.0
RING_RETRY_SECONDS = 0.05

# A pooled connection: autocommit, rows as tuples unless a cursor asks for another factory.
Connection = psycopg.AsyncConnection[TupleRow]
T = TypeVar("T")


@dataclass
class Shard:
    name: str
    pool: ShardPool
    vnodes: list[int]
    reads: ReadBatcher = field(init=False)
    writes: WriteBatcher = field(init=False)

    def __post_init__(self) -> None:
        self.reads = ReadBatcher(self.pool)
        self.writes = WriteBatcher(self.pool)

    def statement_connection(self) -> PooledConnection:
        """A pooled connection for autocommit statements (`async with`), back in the pool
        at the end of the block."""
        return PooledConnection(self.pool)


class PooledConnection:
    """pool.getconn() and pool.putconn() as a context. Not pool.connection(): that one also
    commits or rolls back at the end, which on an autocommit connection does nothing, and
    with its generator-based context that cost 5-10% of a point read's CPU
    (docs/decisions.md, "Prepared statements below psycopg's cursor")."""

    __slots__ = ("conn", "pool")

    def __init__(self, pool: ShardPool) -> None:
        self.pool = pool

    async def __aenter__(self) -> Connection:
        self.conn = await self.pool.getconn()
        return self.conn

    async def __aexit__(self, *exc_info: object) -> None:
        await self.pool.putconn(self.conn)


class ShardSet:
    """The open shards, the ring, and the catalog shard (the first one configured).

    The ring is followed: a statement refused with VnodeMoved (outage.py) makes its caller
    reload it (`follow_ring`), and a task reloads it every RING_POLL_SECONDS. The version
    loaded is noted in the catalog (`shoal.ring_reader`) at each poll and each adoption: a
    moved vnode's old copy is dropped only once every process noted lately has loaded the
    move's ring version (moves.Mover.finish). A new version
    is adopted in one step (no await between the ring and the shards' vnode lists), and a
    shard it names that this process has not opened yet (`shoal shard add`) is opened first,
    from the catalog's sealed DSN (that needs `shard_key`, the credentials key).
    """

    def __init__(
        self,
        ring: Ring,
        shards: dict[str, Shard],
        catalog: Shard,
        buckets_seen: BucketCache,
        *,
        pool_max_size: int = 20,
        shard_key: bytes | None = None,
    ) -> None:
        self.ring = ring
        self.shards = shards
        self.catalog = catalog
        self.buckets_seen = buckets_seen
        self.pool_max_size = pool_max_size
        self.shard_key = shard_key
        self._reload: asyncio.Task[Ring] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._notes: set[asyncio.Task[None]] = set()  # notes of the ring version under way
        # This process (this ShardSet, for a process may open several) in shoal.ring_reader.
        self.reader = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    @classmethod
    async def open(
        cls,
        configs: Sequence[ShardConfig],
        pool_max_size: int = 20,
        *,
        shard_key: bytes | None = None,
        poll_ring: bool = True,
    ) -> ShardSet:
        if not configs:
            raise SchemaError("no shards configured")
        pools: dict[str, ShardPool] = {}
        try:
            for config in configs:
                pools[config.name] = await open_pool(config, pool_max_size)
            async with pools[configs[0].name].connection() as conn:
                ring = await read_ring(conn)
                missing = set(ring.shards) - set(pools)
                for added in await added_shards(conn, shard_key) if missing else []:
                    if added.name in missing:
                        pools[added.name] = await open_pool(added, pool_max_size)
            missing = set(ring.shards) - set(pools)
            if missing:
                raise SchemaError(
                    f"ring version {ring.version} places vnodes on shard(s) "
                    f"{', '.join(sorted(missing))}, which the configuration does not name"
                )
            for name, pool in pools.items():
                try:
                    await check_schema(pool, name, ring.vnodes_of(name), name == configs[0].name)
                except SchemaError as behind:
                    raise await _moves_first(pools[configs[0].name], behind) from None
        except BaseException:
            for pool in pools.values():
                await pool.close()
            raise
        shards = {
            name: Shard(name=name, pool=pool, vnodes=ring.vnodes_of(name))
            for name, pool in pools.items()
        }
        buckets_seen = BucketCache(configs[0].dsn)
        await buckets_seen.start()
        opened = cls(
            ring,
            shards,
            shards[configs[0].name],
            buckets_seen,
            pool_max_size=pool_max_size,
            shard_key=shard_key,
        )
        if poll_ring:
            opened._poller = asyncio.create_task(opened._poll_ring())
        return opened

    async def close(self) -> None:
        for task in (self._poller, self._reload):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*self._notes, return_exceptions=True)
        await self._forget_ring_reader()
        await self.buckets_seen.close()
        for shard in self.shards.values():
            await shard.reads.close()
            await shard.writes.close()
            await shard.pool.close()

    def of_vnode(self, vnode: int) -> Shard:
        return self.shards[self.ring.shard_of(vnode)]

    async def follow_ring(self, wait: float = 0.0) -> bool:
        """Reload the ring and adopt it if it is newer; while it is not, try again for up to
        `wait` seconds (a vnode between its write fence and the switch). True if a newer
        version was adopted. One reload at a time: concurrent callers share it."""
        known = self.ring.version
        deadline = time.monotonic() + wait
        while True:
            if self._reload is None or self._reload.done():
                self._reload = asyncio.create_task(self._read_and_adopt())
            try:
                ring = await asyncio.shield(self._reload)
            except (psycopg.Error, SchemaError, PoolTimeout) as exc:
                # The catalog is down or its ring unreadable: the caller's statement was
                # refused and nothing was written; its client tries again.
                raise MetadataUnavailable(f"cannot read the ring: {first_line(exc)}") from exc
            if ring.version > known or time.monotonic() >= deadline:
                return ring.version > known
            await asyncio.sleep(RING_RETRY_SECONDS)

    async def _read_and_adopt(self) -> Ring:
        async with self.catalog.pool.reading() as conn:
            ring = await read_ring(conn)
            if ring.version <= self.ring.version:
                return self.ring
            missing = set(ring.shards) - set(self.shards)
            if missing:
                await self._open_added(conn, missing)
        self._adopt(ring)
        await self._note_ring_read()
        return ring

    async def _note_ring_read(self) -> None:
        """Note the ring version this process uses (a catalog that cannot take the note
        now gets it at the next poll). Shielded: a cancellation (the store closing) ends the
        caller at once and lets the note finish on its own; close() waits for it."""
        note = asyncio.create_task(self._write_ring_note())
        self._notes.add(note)
        note.add_done_callback(self._notes.discard)
        await asyncio.shield(note)

    async def _write_ring_note(self) -> None:
        # Bounded, as the forgetting below: a catalog whose commits hang must hold neither
        # the poll nor close() (a CLI command would never end).
        try:
            async with asyncio.timeout(CONNECTION_WAIT_SECONDS + CONNECT_TIMEOUT_SECONDS):
                async with self.catalog.pool.connection() as conn:
                    await conn.execute(
                        queries.NOTE_RING_READ,
                        {"process": self.reader, "version": self.ring.version},
                    )
        except Exception as exc:
            log.debug("noting the ring version failed: %r", exc)

    async def _forget_ring_reader(self) -> None:
        """Remove this process's note: a store closed cleanly uses no ring, and a move's
        finish need not wait for its note to age out (moves.Mover.finish). A catalog that
        cannot take it now (an outage) leaves the note to age out."""
        try:
            async with asyncio.timeout(CONNECTION_WAIT_SECONDS + CONNECT_TIMEOUT_SECONDS):
                async with self.catalog.pool.connection() as conn:
                    await conn.execute(queries.FORGET_RING_READER, {"process": self.reader})
        except Exception as exc:
            log.debug("forgetting the ring note failed: %r", exc)

    async def _open_added(self, conn: psycopg.AsyncConnection[Any], names: set[str]) -> None:
        for added in await added_shards(conn, self.shard_key):
            if added.name in names:
                pool = await open_pool(added, self.pool_max_size)
                self.shards[added.name] = Shard(name=added.name, pool=pool, vnodes=[])
        unknown = names - set(self.shards)
        if unknown:
            raise SchemaError(
                f"the ring places vnodes on shard(s) {', '.join(sorted(unknown))}, "
                "which this process cannot open (is the credentials key given?)"
            )

    def _adopt(self, ring: Ring) -> None:
        """Switch to `ring` in one step: no statement sees half of it."""
        for name, shard in self.shards.items():
            shard.vnodes = ring.vnodes_of(name)
        self.ring = ring
        log.info("ring version %d adopted", ring.version)

    async def _poll_ring(self) -> None:
        while True:
            await self._note_ring_read()
            await asyncio.sleep(RING_POLL_SECONDS)
            try:
                await self.follow_ring()
            except Exception as exc:  # a catalog outage: the next poll tries again
                log.debug("reading the ring failed: %r", exc)

    def mark_unreachable(self, names: Iterable[str], reason: str) -> None:
        """Refuse calls to these shards at once until each answers a connect again: how a
        shard that accepts connections but does not answer (a hung host, found by a
        gateway's readiness check) stops holding up the calls that need it."""
        for name in names:
            pool = self.shards[name].pool
            if isinstance(pool, ShardPool):
                pool.lost(TimeoutError(reason))

    def placed(self) -> list[Shard]:
        """The shards that hold at least one vnode."""
        return [s for s in self.shards.values() if s.vnodes]


class LastInFirstOutPool(AsyncConnectionPool):
    """A pool that hands out the connection returned last (psycopg_pool takes the oldest).

    In turn, every pooled connection serves a share of the calls, so after a burst has grown
    the pool to 16 connections a single caller goes round all 16 backends, each cold in the
    CPU caches, and waits about half as long again per put (docs/decisions.md, "A
    last-in-first-out connection pool"; `bench/metadata_bench.py`, put at one caller).
    Taking the most recent one keeps a hot set as small as the concurrency, and leaves the
    rest idle, which is what lets the pool shrink them after `max_idle` (pgbouncer reuses its
    server connections the same way). tests/integration/test_shards.py checks the order,
    since this overrides a method psycopg_pool does not document.
    """

    async def _get_ready_connection(self, timeout: float | None) -> Connection | None:
        if timeout is not None and timeout <= 0.0:
            raise PoolTimeout()
        if not self._pool:
            return await super()._get_ready_connection(timeout)
        conn = self._pool.pop()
        self._nconns_min = min(self._nconns_min, len(self._pool))
        return conn


class _SteadyAttempt(AttemptWithBackoff):
    """psycopg_pool's reconnection attempts, at a steady pace instead of doubling delays."""

    INITIAL_DELAY = PROBE_SECONDS
    DELAY_BACKOFF = 1.0


class ShardPool(LastInFirstOutPool):
    """A shard's pool that knows when its shard is down, and then refuses at once.

    A connect that fails (refused, timed out, the server starting or stopping: outage.py)
    marks the shard down: the calls waiting for a connection and every call after them get
    MetadataUnavailable at once instead of waiting on the pool, and the idle connections,
    which the same outage most likely broke, are dropped. While down, the shard is tried with
    a real connect every PROBE_SECONDS; the first that succeeds (or the first connection the
    pool itself makes) marks it up again, and the pool, which kept trying at the same pace,
    is refilling by then. A connection that breaks in use does not mark the shard down by
    itself (one backend may have been terminated): the idle connections are replaced, and
    their connects decide.
    """

    def __init__(
        self, conninfo: str, *, shard: str, kwargs: dict[str, Any], **options: Any
    ) -> None:
        super().__init__(conninfo, kwargs=kwargs, **options)
        self.shard = shard
        self._probe_with = conninfo, kwargs  # the pool's own may also be callables
        self.down_since: float | None = None
        self._when_down: list[Callable[[], None]] = []
        self._prober: asyncio.Task[None] | None = None
        self._replacing: asyncio.Task[None] | None = None
        self._pinger: psycopg.AsyncConnection[Any] | None = None
        # Drains so far: a batcher lets go of a connection it took before the last one.
        self.drains = 0
        # Since when the commit probe finds the shard's commits hung (None: they come back).
        self.commits_hang_since: float | None = None
        self._last_hang = (0.0, 0.0)  # the last that ended: since, until (monotonic)
        self._commit_probe: asyncio.Task[None] | None = None
        # When the probe's commit was sent: None while it connects (no verdict yet).
        self._commit_probe_sent: float | None = None
        self._probe_connection: psycopg.AsyncConnection[Any] | None = None
        self._probe_refusal_said = False
        self._probe_wait_cancelled = False  # its last commit's wait for a standby was cancelled
        self._closing = False
        self._waiting_writes: set[CommitBound] = set()

    async def getconn(self, timeout: float | None = None) -> Connection:
        self.check_reachable()
        try:
            return await super().getconn(timeout)
        except PoolTimeout as exc:
            raise MetadataUnavailable(
                f"shard {self.shard}: no connection free within {self.timeout:g} s"
            ) from exc

    def check_reachable(self) -> None:
        """MetadataUnavailable while the shard is down."""
        if self.down_since is not None:
            down_for = time.monotonic() - self.down_since
            raise MetadataUnavailable(f"shard {self.shard} is unreachable ({down_for:.1f} s)")

    def check_writable(self) -> None:
        """MetadataUnavailable unless a write could commit now: the shard is reachable and
        its commits come back."""
        self.check_reachable()
        self.check_committing()

    def check_committing(self) -> None:
        """MetadataUnavailable while the shard's commits hang: a write would only wait."""
        if self.commits_hang_since is not None:
            hung_for = time.monotonic() - self.commits_hang_since
            raise MetadataUnavailable(
                f"shard {self.shard} does not commit ({hung_for:.1f} s): writes are refused "
                "until it does"
            )

    def commit_bound(self, seconds: float | None = None) -> CommitBound:
        """The bound of a write's wait on this shard (`async with`): see CommitBound."""
        return CommitBound(self, seconds)

    def probe_commits(self) -> bool:
        """Whether the shard's commits come back, as a commit probe finds; called by the
        readiness check every second, and never waits.

        One probe is out at a time, on a connection of its own: a commit that writes WAL, so
        that it waits as every write's commit does. A probe whose commit was out for
        COMMIT_STALL_SECONDS finds the commits hung (a synchronous standby that does not
        answer, a WAL disk that does not flush): the writes waiting on the shard are given up
        (CommitBound) and new ones are refused at once, while reads go on. The probe is left
        waiting, and its commit, once it comes back, ends that at once. Its connect is not
        timed (a slow connect is not a hung commit), and a probe whose connection fails says
        nothing: whether the shard is down is the ping's business. A probe still out when the
        shard comes back from being down is started again (ShardPool._reachable): its
        connection may be to a server that is gone."""
        probe = self._commit_probe
        if probe is not None and not probe.done():
            sent = self._commit_probe_sent
            if sent is not None and time.monotonic() - sent >= COMMIT_STALL_SECONDS:
                self._declare_hung(sent)
            return self.commits_hang_since is None
        if not self._closing:
            self._commit_probe_sent = None
            self._commit_probe = asyncio.get_running_loop().create_task(self._probe_commit())
        return self.commits_hang_since is None

    async def _probe_commit(self) -> None:
        conn, self._probe_connection = self._probe_connection, None
        try:
            if conn is None:
                conninfo, kwargs = self._probe_with
                conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
                conn.add_notice_handler(self._probe_notice)
            self._commit_probe_sent = time.monotonic()
            self._probe_wait_cancelled = False
            await conn.execute(queries.COMMIT_PROBE)
        except (psycopg.Error, OSError) as exc:
            if conn is None or conn.closed or connection_failed(exc):
                if conn is not None:
                    await conn.close()
                return
            self._probe_connection = conn  # the server answered: the probe itself is refused
            if not self._probe_refusal_said:
                self._probe_refusal_said = True
                log.warning(
                    "shard %s refuses the commit probe, so hung commits go unnoticed: %s",
                    self.shard,
                    first_line(exc),
                )
            return
        except BaseException:
            if conn is not None:
                await conn.close()
            raise
        if self._closing:
            await conn.close()
            return
        self._probe_connection = conn
        if self.commits_hang_since is not None and not self._probe_wait_cancelled:
            now = time.monotonic()
            log.warning(
                "shard %s commits again after %.1f s", self.shard, now - self.commits_hang_since
            )
            self._last_hang = (self.commits_hang_since, now)
            self.commits_hang_since = None

    def _probe_notice(self, notice: psycopg.errors.Diagnostic) -> None:
        """A probe whose wait for a synchronous standby was cancelled (an operator's
        pg_cancel_backend) comes back committed on the primary alone, with this warning:
        that says nothing of the standby, so it does not end a hang."""
        if (notice.message_primary or "").startswith(SYNC_WAIT_CANCELLED):
            self._probe_wait_cancelled = True

    def _probe_again(self) -> None:
        """Give up the probe out (its connection may be to a server that went away): the
        next readiness check sends another. A hang found stays until a probe commits."""
        if self._commit_probe is not None and not self._commit_probe.done():
            self._commit_probe.cancel()  # it closes its connection
        self._commit_probe = None

    def commits_hung_for(self, within: float) -> float:
        """How long the shard's commits hang now, or hung the last time if that ended less
        than `within` seconds ago; else 0."""
        now = time.monotonic()
        if self.commits_hang_since is not None:
            return now - self.commits_hang_since
        since, until = self._last_hang
        return until - since if now - until < within else 0.0

    def _declare_hung(self, since: float) -> None:
        if self.commits_hang_since is not None:
            return
        self.commits_hang_since = since
        log.warning(
            "shard %s does not commit (a commit out for %.1f s): refusing writes until it does",
            self.shard,
            time.monotonic() - since,
        )
        for write in list(self._waiting_writes):
            write.give_up()

    def failure(self, exc: Exception, *, may_have_committed: bool) -> Exception:
        """What a call that met `exc` on this shard raises (outage.classified). A connection
        that broke in use drops the idle ones, which the same cause most likely broke too;
        their replacements' connects then say whether the shard is down."""
        if connection_failed(exc):
            self._replace_idle()
        return classified(exc, self.shard, may_have_committed=may_have_committed)

    def _replace_idle(self) -> None:
        if self.down_since is not None or self.closed or self._replacing is not None:
            return
        self._replacing = asyncio.get_running_loop().create_task(self.drain())
        self._replacing.add_done_callback(self._replaced)

    def _replaced(self, task: asyncio.Task[None]) -> None:
        self._replacing = None
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "shard %s: replacing idle connections failed: %r", self.shard, task.exception()
            )

    async def ping(self) -> bool:
        """Whether the shard answers a trivial statement, sent on a connection kept apart
        from the pool's: a pool whose connections are all busy must not make a busy shard
        look silent. A kept connection that fails (the server restarted since) is replaced
        by a fresh one, whose answer decides; one that connects and answers ends an outage
        the pool was marked down for, as its prober's connect would."""
        conn, self._pinger = self._pinger, None
        if conn is not None and not await _pinged(conn):
            conn = None
        if conn is None:
            if self.closed:
                return False
            try:
                conninfo, kwargs = self._probe_with
                conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
            except (psycopg.Error, OSError):
                return False
            if not await _pinged(conn):
                return False
            self._reachable()
        if self.closed:  # closed while this ping ran: nobody would close the connection
            await conn.close()
            return False
        if self._pinger is not None:  # another ping's, kept while this one ran
            await self._pinger.close()
        self._pinger = conn
        return True

    def when_down(self, refuse: Callable[[], None]) -> None:
        """Call `refuse` each time the shard is marked down: a batcher fails the statements
        queued behind its batches, which may be stuck on a server that hangs."""
        self._when_down.append(refuse)

    def lost(self, exc: BaseException) -> None:
        """A connect to the shard failed: mark it down, until a probe connects."""
        if self.down_since is not None or self.closed:
            return
        self.down_since = time.monotonic()
        log.warning(
            "shard %s is unreachable, refusing calls until it answers: %s",
            self.shard,
            first_line(exc),
        )
        for refuse in self._when_down:
            refuse()
        if self._prober is not None:
            self._prober.cancel()  # one of an outage that ended while it slept
        self._prober = asyncio.get_running_loop().create_task(self._probe())

    def _reachable(self) -> None:
        if self.down_since is None:
            return
        self._probe_again()
        log.warning(
            "shard %s answers again after %.1f s", self.shard, time.monotonic() - self.down_since
        )
        self.down_since = None

    async def _probe(self) -> None:
        try:
            await self._drop_idle_and_waiting()
        except Exception as exc:  # the probe must go on: it is what ends the outage
            log.warning("shard %s: dropping idle connections failed: %r", self.shard, exc)
        while self.down_since is not None and not self.closed:
            try:
                conninfo, kwargs = self._probe_with
                conn = await asyncio.wait_for(
                    psycopg.AsyncConnection.connect(conninfo, **kwargs),
                    PROBE_TIMEOUT_SECONDS,
                )
            except Exception:
                await asyncio.sleep(PROBE_SECONDS)
                continue
            await conn.close()
            self._reachable()

    async def _drop_idle_and_waiting(self) -> None:
        """Refuse the calls waiting for a connection, and replace the idle connections (and
        those in use, as they come back): psycopg_pool's drain."""
        async with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for client in waiting:
            await client.fail(MetadataUnavailable(f"shard {self.shard} is unreachable"))
        await self.drain()

    async def drain(self) -> None:
        """psycopg_pool's drain: the idle connections are replaced, and those in use as they
        come back; batchers hand back the ones they keep (batched.py)."""
        self.drains += 1
        await super().drain()

    async def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = await super()._connect(timeout)
        except Exception as exc:
            if connection_failed(exc):
                self.lost(exc)
            raise
        self._reachable()
        return conn

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = _SteadyAttempt(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing)

    @contextlib.asynccontextmanager
    async def connection(
        self, timeout: float | None = None, *, may_have_committed: bool = True
    ) -> AsyncIterator[Connection]:
        """psycopg_pool's connection(), with a failed connection classified (outage.py):
        whatever the block did may have committed, as far as this pool can tell. Unless
        the block only reads, it is a write's (CommitBound): refused while the shard's
        commits hang, given up (CommitUnknown) when they start to."""
        bound = self.commit_bound() if may_have_committed else contextlib.nullcontext()
        try:
            async with bound, super().connection(timeout) as conn:
                yield conn
        except MetadataError:
            raise  # refused, or given up by the bound: already what the caller gets
        except Exception as exc:
            failure = self.failure(exc, may_have_committed=may_have_committed)
            if failure is exc:
                raise
            raise failure from exc

    def reading(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """A connection for reads only (`async with`): a failed connection is
        MetadataUnavailable, since nothing the block does commits."""
        return self.connection(may_have_committed=False)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A connection in a transaction (`async with`), committed at the end of the block. A
        failed connection is MetadataUnavailable before the COMMIT is sent, CommitUnknown at
        the COMMIT; so is a transaction given up because the shard's commits hang
        (CommitBound)."""
        committing = False
        bound = self.commit_bound()
        bound.sent = False
        try:
            async with bound, super().connection() as conn, conn.transaction():
                yield conn
                committing = bound.sent = True
        except MetadataError:
            raise  # refused, or given up by the bound: already what the caller gets
        except Exception as exc:
            failure = self.failure(exc, may_have_committed=committing)
            if failure is exc:
                raise
            raise failure from exc

    async def close(self, timeout: float = 5.0) -> None:
        self._closing = True  # no probe starts from here on
        tasks = [
            task for task in (self._prober, self._replacing, self._commit_probe) if task is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in (self._pinger, self._probe_connection):
            if conn is not None:
                await conn.close()
        await super().close(timeout)


class CommitBound:
    """A write's wait on its shard (`async with`), bounded: refused at once (MetadataUnavailable)
    while the shard's commits hang, and given up when they start to (ShardPool.probe_commits)
    or after `seconds` (None: no time limit). A write given up raises, instead of the
    TimeoutError, MetadataUnavailable if it was not sent yet, CommitUnknown if it may have
    committed: the caller sets `sent` to False while nothing of the write has left, and to
    True from the moment it may commit (it starts True). Bounds do not nest: given up
    together, the outer one would decide what the inner write raises."""

    __slots__ = ("hung", "pool", "seconds", "sent", "timeout")

    def __init__(self, pool: ShardPool, seconds: float | None) -> None:
        self.pool = pool
        self.seconds = seconds
        self.timeout = asyncio.timeout(seconds)
        self.sent = True
        self.hung = False  # given up because the shard's commits hang

    async def __aenter__(self) -> CommitBound:
        self.pool.check_committing()
        await self.timeout.__aenter__()
        self.pool._waiting_writes.add(self)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.pool._waiting_writes.discard(self)
        try:
            await self.timeout.__aexit__(*exc_info)
        except TimeoutError:  # raised only for a bound that was given up
            raise self._failure() from None

    def give_up(self) -> None:
        """End the wait now (the shard's commits hang)."""
        if not self.timeout.expired():
            self.hung = True
            self.timeout.reschedule(asyncio.get_running_loop().time())

    def _failure(self) -> MetadataUnavailable | CommitUnknown:
        shard = self.pool.shard
        if self.hung or self.seconds is None:
            waited = f"shard {shard} does not commit"
        else:
            waited = f"shard {shard} did not commit within {self.seconds:g} s"
        if self.sent:
            return CommitUnknown(f"{waited}: the write may still commit")
        return MetadataUnavailable(f"{waited}: the write was not sent")


async def _pinged(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether `conn` answers a trivial statement; it is closed if not. A ping cancelled
    midway (its caller stopped waiting) closes it too: its state is then unknown."""
    try:
        await conn.execute(queries.PING)
    except BaseException as exc:
        await conn.close()  # no round trip: the socket is closed
        if isinstance(exc, psycopg.Error | OSError):
            return False
        raise
    return True


async def open_pool(config: ShardConfig, max_size: int) -> ShardPool:
    try:
        async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
            hstore = await TypeInfo.fetch(conn, "hstore")
    except psycopg.OperationalError as exc:
        raise SchemaError(f"cannot connect to shard {config.name}: {first_line(exc)}") from None
    if hstore is None:
        raise SchemaError(f"shard {config.name} is not migrated: run `shoal db migrate`")

    async def configure(conn: psycopg.AsyncConnection) -> None:
        register_hstore(hstore, conn)
        conn.prepared_max = PREPARED_STATEMENTS_PER_CONNECTION
        # Timestamps then arrive with datetime.UTC, not a ZoneInfo of the server's zone:
        # rendering 1000 of them for a listing page costs a third less (no SQL here
        # depends on the session's zone).
        await conn.execute("SET TimeZone = 'UTC'")
        # Prepared statements run their generic plan. PostgreSQL otherwise plans a statement
        # anew for each call while a custom plan's estimated cost beats the generic one's,
        # which for the listing statements (64 vnode arms a shard) it always did: planning
        # was a third or more of every round (docs/decisions.md, "Generic plans";
        # bench/listing_bench.py prints planning time). Shoal's statements find
        # rows by key or key range, so one plan suits every parameter.
        await conn.execute("SET plan_cache_mode = force_generic_plan")

    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in conninfo_to_dict(config.dsn):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    pool = ShardPool(
        config.dsn,
        shard=config.name,
        min_size=1,
        max_size=max_size,
        kwargs=kwargs,
        configure=configure,
        name=f"shoal-{config.name}",
        timeout=CONNECTION_WAIT_SECONDS,
        open=False,
    )
    await pool.open(wait=True)
    await pool.ping()  # its health-check connection, open before the first check needs it
    return pool


async def check_schema(pool: ShardPool, shard: str, vnodes: Sequence[int], catalog: bool) -> None:
    """SchemaError unless every scope of `shard` (the shard's own, the catalog's when it is
    the catalog, each of its vnodes') has every migration this code knows.

    Code newer than its schema would fail at its first statement that needs a newer table
    or column, for a write after its commit (a 500 for a stored object): it refuses to
    start instead. Code older than its schema is not refused: most migrations add, and a
    statement that needs what one removed fails as a fast 503 (docs/metadata.md,
    "Migrations").
    """
    wanted = {"shard": _versions(SHARD_MIGRATIONS)}
    if catalog:
        wanted["catalog"] = _versions(CATALOG_MIGRATIONS)
    applied: dict[str, list[int]] = {}
    async with pool.reading() as conn:
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            applied = dict(await (await conn.execute(queries.APPLIED_BY_SCOPE)).fetchall())
    missing = {scope: sorted(want - set(applied.get(scope, ()))) for scope, want in wanted.items()}
    missing |= {vnode_schema(v): missing_vnode_migrations(applied, v) for v in vnodes}
    behind = [
        f"{scope} without {', '.join(map(str, versions))}"
        for scope, versions in missing.items()
        if versions
    ]
    if behind:
        shown = "; ".join(behind[:3]) + (f"; {len(behind) - 3} more" if len(behind) > 3 else "")
        raise SchemaError(
            f"shard {shard} is not migrated to this Shoal's schema ({shown}): "
            "run `shoal db migrate`"
        )


async def _moves_first(catalog: ShardPool, behind: SchemaError) -> SchemaError:
    """`behind`, saying so when vnodes are moving: `shoal db migrate` leaves those to their
    move, which must finish first."""
    try:
        async with catalog.reading() as conn:
            cur = await conn.execute(queries.MOVING_VNODES)
            moving = [row[0] for row in await cur.fetchall()]
    except psycopg.Error:  # a catalog from before moves: none is under way
        return behind
    if not moving:
        return behind
    return SchemaError(f"{behind} {moves_first(moving)}")


def moves_first(moving: Iterable[int]) -> str:
    """What to do about vnodes that a migration left alone because they are moving."""
    vnodes = ", ".join(map(str, sorted(moving)))
    return (
        f"(vnode(s) {vnodes} are moving, and are migrated only once their move is over: "
        "finish it with the release that started it, `shoal ring move --finish`, then run "
        "`shoal db migrate` again)"
    )


def missing_vnode_migrations(applied: Mapping[str, Sequence[int]], vnode: int) -> list[int]:
    """The vnode migrations this code knows that `vnode`'s schema lacks on a shard whose
    migrations applied, by scope, are `applied` (queries.APPLIED_BY_SCOPE). None for a vnode
    fenced away by a move: its schema and migrations there go by the move's copy's name, and
    its rows are the target's now (moves.py)."""
    scope = vnode_schema(vnode)
    fenced_copy = f"{MOVED_COPY_PREFIX}{scope}_m"
    if scope not in applied and any(name.startswith(fenced_copy) for name in applied):
        return []
    return sorted(_versions(VNODE_MIGRATIONS) - set(applied.get(scope, ())))


def _versions(migrations: Sequence[Migration]) -> set[int]:
    return {migration.version for migration in migrations}


async def read_ring(conn: psycopg.AsyncConnection) -> Ring:
    try:
        rows = await (await conn.execute(queries.SELECT_RING)).fetchall()
    except psycopg.errors.UndefinedTable:
        raise SchemaError("the catalog shard is not migrated: run `shoal db migrate`") from None
    if not rows:
        raise SchemaError("no ring is stored: run `shoal db migrate`")
    return Ring(version=rows[0][0], assignment=tuple(shard for _, _, shard in rows))


async def added_shards(
    conn: psycopg.AsyncConnection[Any], shard_key: bytes | None
) -> list[ShardConfig]:
    """The shards of `shoal shard add`, from the catalog (none without the key to unseal
    their DSNs, or before the catalog is migrated)."""
    if shard_key is None:
        return []
    try:
        rows = await (await conn.execute(queries.ADDED_SHARDS)).fetchall()
    except psycopg.errors.UndefinedTable:
        return []
    return [
        ShardConfig(name=name, dsn=unsealed_dsn(shard_key, name, sealed)) for name, sealed in rows
    ]


def unsealed_dsn(key: bytes, shard: str, sealed: bytes) -> str:
    """An added shard's DSN; SchemaError if this process's credentials key is not the one
    that `shoal shard add` sealed it with."""
    try:
        return unseal(key, shard, bytes(sealed))
    except SealBroken:
        raise SchemaError(
            f"the DSN of shard {shard} does not open with this process's credentials key: "
            "give every process the key of the process that added the shard"
        ) from None


# The pieces of queries.py's statements that several of them share.
_FRAGMENTS = {
    "object_columns": sql.SQL(queries.OBJECT_COLUMNS),
    "part_columns": sql.SQL(queries.PART_COLUMNS),
    "part_as_deletion_record": sql.SQL(queries.PART_AS_DELETION_RECORD),
    "listed_columns": sql.SQL(queries.LISTED_COLUMNS),
    "last_modified": sql.SQL(queries.LAST_MODIFIED),
    "etag": sql.SQL(queries.ETAG),
}


@functools.lru_cache(maxsize=8192)
def render(template: str, vnode: int | None = None, upper_bound: bool = False) -> str:
    """A statement of queries.py for one vnode, as text ready to execute (and prepare)."""
    fragments: dict[str, sql.Composable] = {
        **_FRAGMENTS,
        "upper_bound": sql.SQL(UPPER_BOUND if upper_bound else ""),
    }
    if vnode is not None:
        fragments["schema"] = sql.Identifier(vnode_schema(vnode))
        fragments["vnode"] = sql.Literal(vnode)
    return sql.SQL(template).format(**fragments).as_string(None)


@functools.lru_cache(maxsize=1024)
def render_arms(
    merge: str,
    arm: str,
    vnodes: tuple[int, ...],
    upper_bound: bool = False,
    joiner: str = "UNION ALL",
) -> str:
    """One statement reading every vnode of a shard: `merge` around the arms of each vnode."""
    arms = f"\n{joiner}\n".join(render(arm, v, upper_bound) for v in vnodes)
    return sql.SQL(merge).format(arms=sql.SQL(arms), **_FRAGMENTS).as_string(None)


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@functools.lru_cache(maxsize=16384)
def positional(statement: str) -> tuple[bytes, tuple[str, ...]]:
    """A statement with `%(name)s` placeholders as PostgreSQL's own `$1`, `$2`, ..., as the
    bytes prepared.fetch sends, and the parameter names in that order. The cache holds every
    statement: a few dozen point statements times the vnodes, and the shard-wide ones.

    psycopg caches its own conversion only for texts under 4 KiB; the statements that read
    every vnode of a shard are 30-120 KiB, and re-parsing one cost milliseconds per call.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] is None:
            return "%"
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PLACEHOLDER.sub(number, statement).encode(), tuple(names)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def scalar(row: TupleRow | None, kind: type[T]) -> T:
    """The value of a statement that always returns one row of one column (count(*), EXISTS,
    current_timestamp), checked to be a `kind`."""
    if row is None or not isinstance(row[0], kind):
        raise TypeError(f"a {kind.__name__} was expected as the one value, got {row!r}")
    return row[0]
