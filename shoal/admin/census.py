"""The census: what the admin API, the GC and pipeline metrics and `shoal status` show.

Everything is read from the metadata tier and the meter job's output, cheaply:

- the GC backlog (garbage.read_backlog: exact while small, estimated past that) is read in
  the background at most once a minute (`Census.keep_refreshing`, which `shoal serve` runs),
  with the last GC runs and each pipeline job's last run; the metrics collector and the API
  show those last values and when they were read (`Snapshot.computed_at`);
- the rest (ring and shards, storage nodes, accounts and buckets, runs) is read when asked:
  a few small catalog statements, one per shard for the buckets.

Each shard is read on a connection of its own, opened for the reading and bounded in time,
not through a MetadataStore's pools: a store cannot be opened while a shard is down, and a
shard that does not answer must show as `reachable: false` rather than fail the whole census
(or `shoal status`, which runs with or without `shoal serve`).

The JSON of every method is the admin API's (docs/operations.md, "Admin API").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import class_row, dict_row

from shoal.config import Config, ShardConfig, redact_dsn
from shoal.credentials import load_encryption_key
from shoal.metadata import queries
from shoal.metadata.garbage import (
    EXACT_BACKLOG_LIMIT,
    PAUSED_SETTING,
    Backlog,
    GcRun,
    read_backlog,
)
from shoal.metadata.migrate import applied_versions
from shoal.metadata.pipeline_runs import PipelineRun, read_last_per_job, read_runs
from shoal.metadata.ring import Ring
from shoal.metadata.shards import (
    COMMIT_STALL_SECONDS,
    added_shards,
    first_line,
    read_ring,
    render_arms,
)
from shoal.metadata.status import summarize_versions
from shoal.units import byte_size

log = logging.getLogger("shoal.admin")

T = TypeVar("T")

REFRESH_SECONDS = 60.0
CONNECT_TIMEOUT_SECONDS = 2  # libpq's smallest
# A shard whose reading takes longer than this does not answer, for the census: a few small
# statements, or the backlog (read_backlog's statements each stop at its statement timeout).
ANSWER_SECONDS = 5.0
BACKLOG_ANSWER_SECONDS = 30.0
GC_RUNS_SHOWN = 10
PIPELINE_RUNS_SHOWN = 50
# The meter's last run that wrote its output is among its last this many.
METER_RUNS_LOOKED_AT = 10
# A shard's `commits`: they come back, they hang, or the probe is not allowed to tell.
COMMITTING, HUNG, UNKNOWN = "ok", "hung", "unknown"


class CensusUnavailable(Exception):
    """What was asked cannot be read now; the message says why, in one line."""


class ShardUnreachable(CensusUnavailable):
    """A shard did not answer the census."""


class Readiness(Protocol):
    """What the census needs of the serving process's readiness (shoal/readiness.py)."""

    ready: bool
    reason: str
    hung_shards: list[str]  # shards whose commits hang, as its commit probes find

    def heartbeat_deadline(self, deadline: timedelta) -> timedelta: ...


@dataclass(frozen=True)
class ShardBacklog:
    """A shard's backlog as last read, or why it could not be read."""

    shard: str
    backlog: Backlog | None  # None: the shard did not answer
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """The values the census refreshes in the background, and when they were read."""

    computed_at: datetime
    backlog: list[ShardBacklog]
    gc_runs: list[GcRun] = field(default_factory=list)  # newest first
    last_pipeline_runs: list[PipelineRun] = field(default_factory=list)  # one per job


class Census:
    def __init__(
        self,
        config: Config,
        shards: Sequence[ShardConfig],
        *,
        readiness: Readiness | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        exact_backlog_limit: int = EXACT_BACKLOG_LIMIT,
    ) -> None:
        """`readiness`: the serving process's, when there is one (else derived here)."""
        self.config = config
        self.configured = list(shards)
        # The configured shards, then those `shoal shard add` added: read again with the
        # ring (`ring()`), so that a shard added or removed while this runs is seen.
        self.shards = list(shards)
        self.readiness = readiness
        self.refresh_seconds = refresh_seconds
        self.exact_backlog_limit = exact_backlog_limit
        self.last: Snapshot | None = None
        self._ring: Ring | None = None  # as last read: the shards' vnodes if the catalog is down
        self._refreshing: asyncio.Future[Snapshot] | None = None

    @property
    def catalog(self) -> ShardConfig:
        return self.shards[0]

    # -- the values refreshed in the background --------------------------------------------

    async def keep_refreshing(self, stop: asyncio.Event) -> None:
        """Refresh now and then every `refresh_seconds`, until `stop` is set."""
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception as exc:  # the catalog is down: keep the last values, try again
                log.warning("census: refresh failed: %s", first_line(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.refresh_seconds)

    async def refresh(self) -> Snapshot:
        """Read the backlog, the last GC runs and each job's last run now; one reading at a
        time, shared by whoever asks meanwhile."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._read_snapshot())
        try:
            return await asyncio.shield(self._refreshing)
        finally:
            if self._refreshing is not None and self._refreshing.done():
                self._refreshing = None

    async def current(self) -> Snapshot:
        """The last values, read now if they never were."""
        return self.last if self.last is not None else await self.refresh()

    async def _read_snapshot(self) -> Snapshot:
        ring = await self.ring()
        backlog = await asyncio.gather(
            *(self._shard_backlog(shard, ring.vnodes_of(shard.name)) for shard in self.shards)
        )
        try:
            gc_runs, last_runs = await self._on_catalog(_runs_of_both_kinds)
        except ShardUnreachable as exc:  # the backlog of the other shards is still news
            log.warning("census: runs not read: %s", exc)
            before = self.last
            gc_runs = before.gc_runs if before is not None else []
            last_runs = before.last_pipeline_runs if before is not None else []
        snapshot = Snapshot(datetime.now(UTC), list(backlog), gc_runs, last_runs)
        self.last = snapshot
        return snapshot

    async def _shard_backlog(self, shard: ShardConfig, vnodes: list[int]) -> ShardBacklog:
        async def read(conn: psycopg.AsyncConnection[Any]) -> Backlog:
            return await read_backlog(conn, shard.name, vnodes, self.exact_backlog_limit)

        try:
            backlog = await self._on_shard(shard, read, BACKLOG_ANSWER_SECONDS)
            return ShardBacklog(shard.name, backlog)
        except ShardUnreachable as exc:
            return ShardBacklog(shard.name, None, str(exc))

    # -- what the admin API answers ---------------------------------------------------------

    async def ring(self) -> Ring:
        """The ring, from the catalog (the last one read if the catalog does not answer),
        and with it the shards the catalog lists beyond the configured ones."""
        try:
            ring, added = await self._on_catalog(self._ring_and_added_shards)
        except ShardUnreachable:
            if self._ring is None:
                raise
            return self._ring
        known = {shard.name for shard in self.configured}
        self.shards = self.configured + [shard for shard in added if shard.name not in known]
        self._ring = ring
        return ring

    async def _ring_and_added_shards(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> tuple[Ring, list[ShardConfig]]:
        key = load_encryption_key(self.config.credentials_key_file)
        return await read_ring(conn), await added_shards(conn, key)

    async def cluster(self) -> dict[str, Any]:
        """The ring, each shard, and whether the cluster serves (`ready`) and takes writes on
        every shard (`shards_not_committing` empty)."""
        ring: Ring | None
        try:
            ring = await self.ring()
        except ShardUnreachable:
            ring = None
        shards = await asyncio.gather(*(self._shard_report(s, ring) for s in self.shards))
        hung = [s["name"] for s in shards if s["commits"] == HUNG]
        ready, reason = await self._readiness(shards, catalog_hung=self.catalog.name in hung)
        return {
            "ring": None if ring is None else {"version": ring.version, "vnodes": ring.vnodes},
            "ready": ready,
            "reason": reason,
            "shards_not_committing": hung,
            "shards": list(shards),
        }

    async def nodes(self, catalog_hung: bool = False) -> dict[str, Any]:
        """The storage node registry, each node alive or silent by the heartbeat deadline,
        as the serving process stretches it while the catalog's commits hang (no heartbeat
        can land then: nodes.stretched). `catalog_hung`: a probe of the caller's own found
        them hanging, without knowing since when: a node whose heartbeat is late is then
        `unknown`, not `silent`."""
        deadline = self.config.storage.heartbeat_deadline
        if self.readiness is not None:  # it knows when the heartbeats could not land
            deadline = self.readiness.heartbeat_deadline(deadline)
            catalog_hung = False

        async def read(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(queries.CENSUS_NODES, {"deadline": deadline})
            return await cur.fetchall()

        rows = await self._on_catalog(read)
        return {"nodes": [_node_json(row, catalog_hung) for row in rows]}

    async def accounts(self) -> dict[str, Any]:
        """Accounts and their buckets (live), with objects and bytes from the last meter run."""
        accounts, last_meter = await self._on_catalog(_accounts_and_last_meter)
        ring = await self.ring()
        found = await asyncio.gather(
            *(self._buckets_of(shard, ring.vnodes_of(shard.name)) for shard in self.shards)
        )
        buckets: dict[str, list[dict[str, Any]]] = {}
        for rows in found:
            for row in rows or []:
                buckets.setdefault(str(row["owner"]), []).append(row)
        history = meter_history(self.config, last_meter)
        meter = await asyncio.to_thread(read_last_meter, history, last_meter)
        metered = meter.buckets if meter is not None else {}
        result = []
        for account in accounts:
            name = account["name"]
            mine = sorted(buckets.get(str(account["id"]), []), key=lambda b: b["name"])
            totals = meter.accounts.get(name) if meter is not None else None
            result.append(
                {
                    "name": name,
                    "id": str(account["id"]),
                    "created": _when(account["created"]),
                    "objects": totals[0] if totals else None,
                    "bytes": totals[1] if totals else None,
                    "buckets": [_bucket_json(b, metered.get((name, b["name"]))) for b in mine],
                }
            )
        silent = [s.name for s, rows in zip(self.shards, found, strict=True) if rows is None]
        return {
            "metered_at": _when(meter.metered_at) if meter is not None else None,
            "accounts": result,
            # Their buckets are missing above.
            "unreachable_shards": silent,
        }

    async def usage(self) -> dict[str, Any]:
        """Objects and logical bytes per day and account, from the meter job's history."""
        last_meter = await self._on_catalog(_last_meter)
        days = await asyncio.to_thread(read_usage_days, meter_history(self.config, last_meter))
        return {"days": days}

    async def gc(self) -> dict[str, Any]:
        snapshot = await self.current()

        async def read(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, list[GcRun]]:
            cur = await conn.execute(queries.SELECT_SETTING, {"key": PAUSED_SETTING})
            row = await cur.fetchone()
            return row is not None and row[0] == "True", await _gc_runs(conn)

        paused, runs = await self._on_catalog(read)
        return {
            "paused": paused,
            "backlog": [_backlog_json(entry) for entry in snapshot.backlog],
            "computed_at": _when(snapshot.computed_at),
            "runs": [_gc_run_json(run) for run in runs],
        }

    async def pipeline(
        self, job: str | None = None, limit: int = PIPELINE_RUNS_SHOWN
    ) -> dict[str, Any]:
        runs = await self._on_catalog(lambda conn: read_runs(conn, job, limit))
        return {"runs": [pipeline_run_json(run) for run in runs]}

    async def status(self) -> dict[str, Any]:
        """Everything `shoal status` shows: cluster, nodes, accounts, gc and pipeline."""
        cluster = await self.cluster()
        report: dict[str, Any] = {"cluster": cluster}
        catalog_hung = self.catalog.name in cluster["shards_not_committing"]
        for part, read in (
            ("nodes", lambda: self.nodes(catalog_hung)),
            ("accounts", self.accounts),
            ("gc", self.gc),
            ("pipeline", lambda: self.pipeline(limit=10)),
        ):
            try:
                report[part] = await read()
            except CensusUnavailable as exc:
                report[part] = {"error": str(exc)}
        return report

    # -- reading shards ----------------------------------------------------------------------

    async def _on_catalog(self, read: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        return await self._on_shard(self.catalog, read)

    async def _on_shard(
        self,
        shard: ShardConfig,
        read: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        seconds: float = ANSWER_SECONDS,
    ) -> T:
        """`read(conn)` on a connection of its own to the shard, within `seconds`, or
        ShardUnreachable."""
        try:
            async with asyncio.timeout(seconds), _connection(shard) as conn:
                return await read(conn)
        except TimeoutError:
            raise ShardUnreachable(
                f"shard {shard.name} did not answer within {seconds:g} s"
            ) from None
        except (psycopg.OperationalError, OSError) as exc:
            raise ShardUnreachable(f"shard {shard.name}: {first_line(exc)}") from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
            raise CensusUnavailable(
                f"shard {shard.name} is not migrated to this version: run `shoal db migrate`"
            ) from None

    async def _shard_report(self, shard: ShardConfig, ring: Ring | None) -> dict[str, Any]:
        vnodes = ring.vnodes_of(shard.name) if ring is not None else []

        async def read(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
            versions = await applied_versions(conn)
            return {
                "server_version": conn.info.parameter_status("server_version"),
                "schema_versions": summarize_versions(versions),
                "commits": await self._commits(shard, conn),
            }

        report: dict[str, Any] = {
            "name": shard.name,
            "dsn": redact_dsn(shard.dsn),
            "reachable": True,
            "commits": None,
            "server_version": None,
            "vnodes": vnodes,
            "vnode_count": len(vnodes),
            "schema_versions": {},
        }
        try:
            report |= await self._on_shard(shard, read, ANSWER_SECONDS + COMMIT_STALL_SECONDS)
        except ShardUnreachable as exc:
            report |= {"reachable": False, "error": str(exc)}
        return report

    async def _commits(self, shard: ShardConfig, conn: psycopg.AsyncConnection[Any]) -> str:
        """Whether the shard's commits come back (`ok`) or hang (`hung`: a synchronous
        standby that does not answer holds them): as the serving process's commit probe
        finds, or, without one, by a probe of its own (ShardPool.probe_commits sends the
        same): a commit that writes WAL, given COMMIT_STALL_SECONDS. One still out then is
        cancelled; a commit waiting for a standby stays committed on the primary alone,
        which for a logical message changes nothing."""
        if self.readiness is not None:
            return HUNG if shard.name in self.readiness.hung_shards else COMMITTING
        try:
            async with asyncio.timeout(COMMIT_STALL_SECONDS):
                await conn.execute(queries.COMMIT_PROBE)
        except TimeoutError:
            return HUNG
        except psycopg.errors.InsufficientPrivilege:
            return UNKNOWN  # a role without pg_logical_emit_message: the gateway warns of it
        return COMMITTING

    async def _readiness(
        self, shards: Sequence[dict[str, Any]], catalog_hung: bool
    ) -> tuple[bool, str]:
        """The serving process's readiness; without one, whether every shard answers and
        enough storage nodes heartbeat to take a write (by the registry alone; while the
        catalog's commits hang, a node whose heartbeat could not land is not counted
        against, as the serving process stretches their deadline). A shard whose commits
        hang does not make the cluster unready, as it does not a gateway: its reads go on."""
        if self.readiness is not None:
            return self.readiness.ready, self.readiness.reason
        silent = [s["name"] for s in shards if not s["reachable"]]
        if silent:
            return False, f"metadata shard(s) {', '.join(silent)} do not answer"
        nodes = (await self.nodes(catalog_hung))["nodes"]
        alive = sum(n["state"] in ("alive", "unknown") for n in nodes)
        needed = max(1, min(self.config.storage.replicas or 1, len(nodes)))
        if alive < needed:
            return False, f"{alive} storage node(s) alive, {needed} needed"
        return True, "ready"

    async def _buckets_of(
        self, shard: ShardConfig, vnodes: list[int]
    ) -> list[dict[str, Any]] | None:
        """Every bucket a shard holds (None if it does not answer)."""
        if not vnodes:
            return []

        async def read(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                render_arms(queries.ALL_BUCKETS, queries.ALL_BUCKETS_ARM, tuple(vnodes))
            )
            return await cur.fetchall()

        try:
            return await self._on_shard(shard, read)
        except ShardUnreachable as exc:
            log.warning("census: buckets of %s not read: %s", shard.name, exc)
            return None


@contextlib.asynccontextmanager
async def _connection(shard: ShardConfig) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in conninfo_to_dict(shard.dsn):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    async with await psycopg.AsyncConnection.connect(shard.dsn, **kwargs) as conn:
        await conn.execute("SET TimeZone = 'UTC'")
        yield conn


async def _runs_of_both_kinds(
    conn: psycopg.AsyncConnection[Any],
) -> tuple[list[GcRun], list[PipelineRun]]:
    return await _gc_runs(conn), await read_last_per_job(conn)


async def _gc_runs(conn: psycopg.AsyncConnection[Any]) -> list[GcRun]:
    cur = conn.cursor(row_factory=class_row(GcRun))
    await cur.execute(queries.LAST_GC_RUNS, {"limit": GC_RUNS_SHOWN})
    return await cur.fetchall()


async def _accounts_and_last_meter(
    conn: psycopg.AsyncConnection[Any],
) -> tuple[list[dict[str, Any]], PipelineRun | None]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(queries.LIST_ACCOUNTS)
    return await cur.fetchall(), await _last_meter(conn)


async def _last_meter(conn: psycopg.AsyncConnection[Any]) -> PipelineRun | None:
    """The meter's last run that wrote its output (None before any was recorded)."""
    runs = await read_runs(conn, "meter", METER_RUNS_LOOKED_AT)
    return next((run for run in runs if run.outcome != "failed"), None)


def meter_history(config: Config, last_meter: PipelineRun | None) -> Path:
    """The meter job's history: where its last recorded run wrote it (`--output` may have
    put it elsewhere), else the default place."""
    if last_meter is not None and last_meter.output:
        return Path(last_meter.output)
    return config.data_dir / "pipeline" / "meter" / "history"


# -- the meter job's output --------------------------------------------------------------------


@dataclass(frozen=True)
class MeterReading:
    """The last metered day: objects and logical bytes per (account, bucket) and account."""

    date: str
    metered_at: datetime
    buckets: dict[tuple[str, str], tuple[int, int]]
    accounts: dict[str, tuple[int, int]]


def _meter_table(history: Path, columns: list[str]) -> Any:
    """The meter history as one pyarrow table with a `date` column (None if there is none)."""
    if not history.is_dir() or not any(history.glob("date=*")):
        return None
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(history), format="parquet", partitioning="hive")
    return dataset.to_table(columns=columns)


def read_last_meter(history: Path, run: PipelineRun | None) -> MeterReading | None:
    """The meter's last day, as its last run (`run`, if recorded) wrote it."""
    table = _meter_table(history, ["date", "account", "bucket", "objects", "logical_bytes"])
    if table is None:
        return None
    rows = table.to_pylist()
    day = max(str(r["date"]) for r in rows)
    buckets: dict[tuple[str, str], tuple[int, int]] = {}
    accounts: dict[str, tuple[int, int]] = {}
    for row in rows:
        if str(row["date"]) != day:
            continue
        key = (row["account"], row["bucket"])
        objects, size = buckets.get(key, (0, 0))
        buckets[key] = (objects + row["objects"], size + row["logical_bytes"])
        objects, size = accounts.get(row["account"], (0, 0))
        accounts[row["account"]] = (objects + row["objects"], size + row["logical_bytes"])
    if run is not None and run.finished is not None:
        metered_at = run.finished
    else:  # written before runs were recorded: when the day's files were
        files = list((history / f"date={day}").glob("*.parquet"))
        stamp = max((os.stat(f).st_mtime for f in files), default=0.0)
        metered_at = datetime.fromtimestamp(stamp, UTC)
    return MeterReading(day, metered_at, buckets, accounts)


def read_usage_days(history: Path) -> list[dict[str, Any]]:
    """Objects and logical bytes per metered day and account, oldest day first."""
    table = _meter_table(history, ["date", "account", "objects", "logical_bytes"])
    if table is None:
        return []
    days: dict[tuple[str, str], tuple[int, int]] = {}
    for row in table.to_pylist():
        key = (str(row["date"]), row["account"])
        objects, size = days.get(key, (0, 0))
        days[key] = (objects + row["objects"], size + row["logical_bytes"])
    return [
        {"date": date, "account": account, "objects": objects, "bytes": size}
        for (date, account), (objects, size) in sorted(days.items())
    ]


# -- JSON ------------------------------------------------------------------------------------


def _when(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, as every timestamp of the admin API."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _node_json(row: dict[str, Any], catalog_hung: bool) -> dict[str, Any]:
    capacity, free = row["capacity_bytes"], row["free_bytes"]
    age = row["heartbeat_age_seconds"]
    silent = "unknown" if catalog_hung else "silent"  # its heartbeats could not land
    return {
        "name": row["name"],
        "datacenter": row["datacenter"],
        "shark": f"{row['datacenter']}:{row['name']}",
        "url": row["url"],
        # Its admin listener (/ready, /metrics) where it runs one: a column of later schemas.
        "admin_url": row.get("admin_url"),
        "state": "alive" if row["alive"] else silent,
        "heartbeat": _when(row["heartbeat"]),
        "heartbeat_age_seconds": None if age is None else round(age, 1),
        "capacity_bytes": capacity,
        "free_bytes": free,
        "used_bytes": capacity - free if capacity is not None and free is not None else None,
        # Blocks held, as the node reports them: a column of later schemas (null before).
        "blocks": row.get("blocks"),
    }


def _bucket_json(row: dict[str, Any], metered: tuple[int, int] | None) -> dict[str, Any]:
    return {
        "name": row["name"],
        "created": _when(row["created"]),
        "objects": metered[0] if metered else None,
        "bytes": metered[1] if metered else None,
    }


def _backlog_json(entry: ShardBacklog) -> dict[str, Any]:
    backlog = entry.backlog
    if backlog is None:
        return {
            "shard": entry.shard,
            "reachable": False,
            "records": None,
            "bytes": None,
            "oldest": None,
            "windows": None,
            "estimated": False,
            "error": entry.error,
        }
    return {
        "shard": entry.shard,
        "reachable": True,
        "records": backlog.records,
        "bytes": backlog.bytes,
        "oldest": _when(backlog.oldest),
        "windows": backlog.windows,
        "estimated": backlog.estimated,
    }


def _gc_run_json(run: GcRun) -> dict[str, Any]:
    return {
        "kind": run.kind,
        "started": _when(run.started),
        "finished": _when(run.finished),
        "duration_seconds": round((run.finished - run.started).total_seconds(), 3),
        "records_found": run.records_found,
        "records_reclaimed": run.records_reclaimed,
        "records_failed": run.records_failed,
        "blocks_deleted": run.blocks_deleted,
        "bytes_reclaimed": run.bytes_reclaimed,
        "windows_dropped": run.windows_dropped,
    }


def pipeline_run_json(run: PipelineRun) -> dict[str, Any]:
    duration = run.duration_seconds
    return {
        "id": run.id,
        "job": run.job,
        "started": _when(run.started),
        "finished": _when(run.finished),
        "duration_seconds": None if duration is None else round(duration, 3),
        "outcome": run.outcome,
        "figures": run.figures,
        "problems": run.problems,
        "error": run.error,
        "output": run.output,
    }


# -- terminal tables (`shoal status`, `shoal pipeline history`) -------------------------------


def format_status(report: dict[str, Any]) -> str:
    """`shoal status`: the census as terminal tables."""
    sections = [
        _format_cluster(report["cluster"]),
        _format_part(report["nodes"], _format_nodes),
        _format_part(report["accounts"], _format_accounts),
        _format_part(report["gc"], _format_gc),
        _format_part(report["pipeline"], lambda p: format_pipeline_runs(p["runs"])),
    ]
    return "\n\n".join(sections)


def format_pipeline_runs(runs: Sequence[dict[str, Any]]) -> str:
    """Pipeline runs (as pipeline_run_json makes them) as a table, in the order given."""
    if not runs:
        return "pipeline runs: none recorded"
    rows = [
        [
            str(r["id"]),
            r["job"],
            _short(r["started"]),
            _seconds(r["duration_seconds"]),
            r["outcome"],
            r["error"] or "; ".join(r["problems"]) or "",
        ]
        for r in runs
    ]
    return "pipeline runs:\n" + _table(
        ["id", "job", "started", "took", "outcome", "problems / error"], rows, right={0, 3}
    )


def _format_part(part: dict[str, Any], format_part: Callable[[dict[str, Any]], str]) -> str:
    if "error" in part and len(part) == 1:
        return f"unavailable: {part['error']}"
    return format_part(part)


def _format_cluster(cluster: dict[str, Any]) -> str:
    ring = cluster["ring"]
    where = f"ring version {ring['version']}, {ring['vnodes']} vnodes" if ring else "ring unknown"
    ready = "ready" if cluster["ready"] else f"NOT READY: {cluster['reason']}"
    hung = cluster["shards_not_committing"]
    if hung:
        ready += f"; WRITES REFUSED: the commits of shard(s) {', '.join(hung)} do not come back"
    rows = [
        [
            s["name"],
            "yes" if s["reachable"] else "NO",
            {HUNG: "HUNG", None: "-"}.get(s["commits"], s["commits"]),
            s["server_version"] or "-",
            str(s["vnode_count"]),
            ", ".join(f"{k} v{v}" for k, v in sorted(s["schema_versions"].items())) or "-",
            s["dsn"],
        ]
        for s in cluster["shards"]
    ]
    headers = ["shard", "answers", "commits", "postgres", "vnodes", "schema", "dsn"]
    return f"cluster: {where}; {ready}\n" + _table(headers, rows, right={4})


def _format_nodes(nodes: dict[str, Any]) -> str:
    rows = [
        [
            n["shark"],
            n["state"],
            _seconds(n["heartbeat_age_seconds"]),
            _bytes(n["used_bytes"]),
            _bytes(n["free_bytes"]),
            "-" if n["blocks"] is None else f"{n['blocks']:,}",
            n["url"],
            n["admin_url"] or "-",
        ]
        for n in nodes["nodes"]
    ]
    if not rows:
        return "storage nodes: none registered"
    alive = sum(n["state"] == "alive" for n in nodes["nodes"])
    title = f"storage nodes: {alive} alive of {len(rows)}"
    if any(n["state"] == "unknown" for n in nodes["nodes"]):
        title += " (the catalog's commits hang: heartbeats cannot land, so a late one is unknown)"
    headers = ["storage node", "state", "heartbeat", "used", "free", "blocks", "url", "admin"]
    return f"{title}\n" + _table(headers, rows, right={2, 3, 4, 5})


def _format_accounts(accounts: dict[str, Any]) -> str:
    metered = accounts["metered_at"]
    title = (
        f"accounts (objects and bytes as metered {_short(metered)})"
        if metered
        else ("accounts (not metered yet: run `shoal pipeline meter`)")
    )
    if not accounts["accounts"]:
        return "accounts: none (`shoal account create NAME` makes one)"
    rows = []
    for account in accounts["accounts"]:
        rows.append([account["name"], "", _count(account["objects"]), _bytes(account["bytes"])])
        rows += [
            ["", b["name"], _count(b["objects"]), _bytes(b["bytes"])] for b in account["buckets"]
        ]
    lines = title + "\n" + _table(["account", "bucket", "objects", "bytes"], rows, right={2, 3})
    if accounts.get("unreachable_shards"):
        lines += f"\n  (buckets of {', '.join(accounts['unreachable_shards'])} not shown)"
    return lines


def _format_gc(gc: dict[str, Any]) -> str:
    rows = [
        [
            b["shard"],
            _count(b["records"]) + ("~" if b["estimated"] else ""),
            _bytes(b["bytes"]) + ("~" if b["estimated"] else ""),
            _short(b["oldest"]) if b["oldest"] else "-",
            "-" if b["windows"] is None else str(b["windows"]),
        ]
        if b["reachable"]
        else [b["shard"], "?", "?", "does not answer", "?"]
        for b in gc["backlog"]
    ]
    state = "PAUSED" if gc["paused"] else "running"
    estimated = " (~: estimated)" if any(b["estimated"] for b in gc["backlog"]) else ""
    lines = [
        f"gc daemon: {state}; backlog as of {_short(gc['computed_at'])}{estimated}",
        _table(["shard", "records", "bytes", "oldest", "windows"], rows, right={1, 2, 4}),
    ]
    if gc["runs"]:
        runs = [
            [
                r["kind"],
                _short(r["finished"]),
                _seconds(r["duration_seconds"]),
                _count(r["records_found"]),
                _count(r["records_reclaimed"]),
                _count(r["records_failed"]),
                _bytes(r["bytes_reclaimed"]),
            ]
            for r in gc["runs"]
        ]
        headers = ["gc run", "finished", "took", "found", "reclaimed", "failed", "bytes"]
        lines.append(_table(headers, runs, right={2, 3, 4, 5, 6}))
    else:
        lines.append("gc runs: none recorded")
    return "\n".join(lines)


def _table(headers: list[str], rows: list[list[str]], right: Set[int] = frozenset()) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return (
            "  "
            + "  ".join(
                str(c).rjust(w) if i in right else str(c).ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )

    return "\n".join([line(headers), *(line(row) for row in rows)])


def _short(when: str | None) -> str:
    """An API timestamp as the table shows it: to the second, in UTC."""
    return "-" if when is None else when[:19].replace("T", " ")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}s"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else byte_size(value)
