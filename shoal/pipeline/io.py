"""How Spark reads Shoal: metadata rows from one consistent snapshot per shard, block
inventories from the storage nodes; and how executors delete blocks and records.

Metadata: the driver opens one REPEATABLE READ transaction per shard and exports its snapshot
(`pg_export_snapshot()`); each partition reader (a few vnodes per Spark task) imports it with
`SET TRANSACTION SNAPSHOT`, so all readers of a shard see the same instant while reading in
parallel. Readers fetch Arrow record batches through ADBC's PostgreSQL driver and hand them
to Spark as they are (mapInArrow), so no row becomes a Python object. Values keep their
meaning: uuid as text, hstore as a map, arrays as arrays, bytea as binary, timestamptz as
timestamps (UTC), jsonb as JSON text. The driver's own small reads (bucket lists, the
catalog) use psycopg.

Everything an executor does is batched and idempotent, so a task that is retried or a job
that is run again after a crash converges.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import adbc_driver_postgresql.dbapi as adbc_postgresql
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from adbc_driver_manager import Error as AdbcError
from adbc_driver_manager import OperationalError as AdbcOperationalError
from adbc_driver_manager.dbapi import Connection as AdbcConnection
from psycopg import sql
from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from shoal.config import Config, ShardConfig
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import queries
from shoal.metadata.errors import MetadataUnavailable
from shoal.metadata.outage import classified, lost_connection, vnode_gone
from shoal.metadata.ring import Ring, vnode_schema
from shoal.metadata.shards import scalar
from shoal.pipeline.progress import rows_read
from shoal.storage.client import ClientSettings

if TYPE_CHECKING:
    from shoal.metadata.garbage import WindowClearing

# Columns of a deletion record (or of a row of a deleted bucket, read as one).
RECORD_SCHEMA = T.StructType(
    [
        T.StructField("shard", T.StringType(), False),
        T.StructField("vnode", T.IntegerType(), False),
        T.StructField("kind", T.StringType(), False),  # record | bucket_object | bucket_part
        T.StructField("id", T.StringType(), False),
        T.StructField("owner", T.StringType(), False),
        T.StructField("bucket_id", T.StringType(), False),
        T.StructField("name", T.StringType(), False),
        T.StructField("created", T.TimestampType(), True),
        T.StructField("content_length", T.LongType(), True),
        T.StructField("content_md5", T.BinaryType(), True),
        T.StructField("content_type", T.StringType(), True),
        T.StructField("headers", T.MapType(T.StringType(), T.StringType()), True),
        T.StructField("sharks", T.ArrayType(T.StringType()), True),
        T.StructField("properties", T.StringType(), True),
        T.StructField("deleted_at", T.TimestampType(), True),
    ]
)

# RECORD_SCHEMA as Arrow: what the partition readers hand Spark.
ARROW_RECORD_SCHEMA = to_arrow_schema(RECORD_SCHEMA, timezone="UTC")

# hstore is read as hstore_to_array's text[] (key, value, key, value...), which the reader
# makes a map without a Python object per row (_map_of_pairs).
OBJECT_COLUMNS = """
    id::text, owner::text, bucket_id::text, name, created, content_length, content_md5,
    content_type, hstore_to_array(headers), sharks, properties::text
"""

DELETION_RECORDS = """
SELECT 'record', {columns}, deleted_at FROM {schema}.manta_bucket_deleted_object
WHERE deleted_at < {cutoff}
"""

LIVE_OBJECTS = """
SELECT 'object', {columns}, NULL::timestamptz FROM {schema}.manta_bucket_object
"""

# The properties (jsonb read as text) of a row whose blocks and bytes do not follow from its
# columns alone: the parts of a multipart object, or bytes held in the row itself. Jobs that
# work on Arrow columns look inside those rows' properties (properties_of), and only those.
PARTS_OR_INLINE = r'"parts"|"inline"'


def properties_of(text: str | None) -> dict[str, Any]:
    """A row's properties; most rows of a job hold the same few (read only, so shared)."""
    return _parsed_properties(text) if text else {}


@functools.lru_cache(maxsize=4096)
def _parsed_properties(text: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(text)
    return parsed


# What the whole-store inventory reports of each live object, the JSON it needs taken out by
# PostgreSQL (jsonb, already parsed): read as the query's own columns (ReadTask.as_records
# False), not as RECORD_SCHEMA.
INVENTORY_OBJECTS = """
SELECT bucket_id::text, name, content_length, content_md5, created, content_type, sharks,
       (properties -> 'tags')::text AS tags,
       CASE jsonb_typeof(properties -> 'parts')
           WHEN 'array' THEN jsonb_array_length(properties -> 'parts')
       END AS parts
FROM {schema}.manta_bucket_object
"""

# The live objects of some bucket incarnations ({wanted}: their ids), with the time of their
# last change in the `created` column: Last-Modified, as S3 lists it.
LIVE_OBJECTS_OF_BUCKETS = """
SELECT 'object', id::text, owner::text, bucket_id::text, name, modified, content_length,
       content_md5, content_type, hstore_to_array(headers), sharks, properties::text,
       NULL::timestamptz
FROM {schema}.manta_bucket_object WHERE bucket_id = ANY({wanted}::uuid[])
"""

# Rows of bucket incarnations deleted before the cutoff (buckets of any vnode: the list of
# dead incarnations is passed in, since bucket and object rows live on different vnodes).
DEAD_BUCKET_CONTENTS = """
SELECT 'bucket_object', {columns}, NULL::timestamptz FROM {schema}.manta_bucket_object
WHERE bucket_id = ANY({dead}::uuid[])
UNION ALL
SELECT 'bucket_part', id::text, owner::text, bucket_id::text, name, created, content_length,
       content_md5, NULL, NULL::text[], sharks,
       (coalesce(properties, '{}'::jsonb) || jsonb_build_object(
           'upload_id', upload_id, 'part_number', part_number))::text,
       NULL::timestamptz
FROM {schema}.manta_bucket_upload_part WHERE bucket_id = ANY({dead}::uuid[])
"""

DEAD_BUCKETS = """
SELECT id::text, owner::text, name FROM {schema}.manta_bucket_deleted_bucket
WHERE deleted_at < {cutoff}
"""

ALL_DELETED_BUCKETS = """
SELECT id::text, owner::text, name FROM {schema}.manta_bucket_deleted_bucket
"""

BUCKETS = """
SELECT id::text, owner::text, name FROM {schema}.manta_bucket
"""

ACCOUNTS = "SELECT id::text, name FROM shoal.account"

OPEN_PARTS = """
SELECT 'part', id::text, owner::text, bucket_id::text, name, created, content_length,
       content_md5, NULL, NULL::text[], sharks, properties::text, NULL::timestamptz
FROM {schema}.manta_bucket_upload_part
"""

ALL_DELETION_RECORDS = """
SELECT 'record', {columns}, deleted_at FROM {schema}.manta_bucket_deleted_object
"""


# A shard that does not answer a connect within this fails the task, never holds it.
CONNECT_SECONDS = 10


def connect(shard: str, dsn: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection to a shard, from the driver or an executor. A shard that cannot be reached
    is named in the error (an executor's error reaches the user as its last line)."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_SECONDS)
    except psycopg.Error as exc:
        raise classified(exc, shard, may_have_committed=False) from None


@dataclass(frozen=True)
class ReadTask:
    shard: str
    dsn: str
    snapshot: str
    vnode: int
    query: str  # with {schema}
    # Every shard of the job (name, DSN), the catalog first: where to look for the vnode if
    # it moved to another shard since the job read the ring.
    shards: tuple[tuple[str, str], ...] = ()
    # The rows as RECORD_SCHEMA, after their shard and vnode; False: the query's own columns
    # as ADBC reads them (a job that reads few columns, and works on them in its tasks).
    as_records: bool = True


@contextlib.contextmanager
def exported_snapshots(shards: Sequence[ShardConfig]) -> Iterator[dict[str, str]]:
    """One snapshot per shard, held open by the driver while the executors read."""
    connections = []
    try:
        snapshots = {}
        for shard in shards:
            conn = connect(shard.name, shard.dsn)
            connections.append(conn)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            exported = conn.execute("SELECT pg_export_snapshot()").fetchone()
            snapshots[shard.name] = scalar(exported, str)
        yield snapshots
    finally:
        for conn in connections:
            # End the transaction before closing: ROLLBACK returns once the server has let
            # go of the snapshot, while a closed socket's backend may hold it a moment
            # longer, and a VACUUM run then (the gc job's, next) keeps the dead rows.
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            conn.close()


def driver_rows(
    shards: Sequence[ShardConfig],
    ring: Ring,
    snapshots: dict[str, str],
    template: str,
    **literals: Any,
) -> list[tuple[Any, ...]]:
    """Small reads (bucket lists) done by the driver itself, in the same snapshots."""
    rows: list[tuple[Any, ...]] = []
    for shard in shards:
        vnodes = ring.vnodes_of(shard.name)
        if not vnodes:
            continue
        with connect(shard.name, shard.dsn) as conn:
            _join_snapshot(conn, snapshots[shard.name], shard.name)
            for vnode in vnodes:
                query = template.replace(
                    "{schema}", sql.Identifier(vnode_schema(vnode)).as_string(None)
                )
                for name, value in literals.items():
                    query = query.replace("{" + name + "}", sql.Literal(value).as_string(None))
                rows += conn.execute(query).fetchall()
            conn.execute("COMMIT")
    return rows


def catalog_rows(shards: Sequence[ShardConfig], query: str) -> list[tuple[Any, ...]]:
    with connect(shards[0].name, shards[0].dsn, autocommit=False) as conn:
        return conn.execute(query).fetchall()


def database_time_minus(shard: ShardConfig, seconds: float) -> datetime:
    """`now - seconds` by the database's clock (ages are never judged by a worker's clock)."""
    with connect(shard.name, shard.dsn, autocommit=False) as conn:
        row = conn.execute(
            "SELECT current_timestamp - make_interval(secs => %s)", (seconds,)
        ).fetchone()
    return scalar(row, datetime)


def read_rows(
    spark: SparkSession,
    shards: Sequence[ShardConfig],
    ring: Ring,
    snapshots: dict[str, str],
    template: str,
    **literals: Any,
) -> DataFrame:
    """Rows of RECORD_SCHEMA from every vnode, a few vnodes per Spark task, in one snapshot.

    Templates hold `{schema}`, `{columns}` and `{name}` placeholders for `literals`; they are
    replaced as text (no str.format), so SQL braces such as '{}'::jsonb stay as they are.
    Executors read Arrow record batches (ADBC) and hand them to Spark as they are
    (mapInArrow): no Python object per row on either side.
    """
    tasks = read_tasks(shards, ring, snapshots, template, **literals)
    return map_read(spark, tasks, _as_read, RECORD_SCHEMA)


def read_tasks(
    shards: Sequence[ShardConfig],
    ring: Ring,
    snapshots: dict[str, str],
    template: str,
    *,
    as_records: bool = True,
    **literals: Any,
) -> list[ReadTask]:
    """One ReadTask per vnode for `template` (placeholders as read_rows; `as_records` as
    ReadTask's)."""
    dsns = {s.name: s.dsn for s in shards}
    query = template.replace("{columns}", OBJECT_COLUMNS)
    for name, value in literals.items():
        query = query.replace("{" + name + "}", sql.Literal(value).as_string(None))
    every = tuple((s.name, s.dsn) for s in shards)
    return [
        ReadTask(
            ring.shard_of(v),
            dsns[ring.shard_of(v)],
            snapshots[ring.shard_of(v)],
            v,
            query,
            every,
            as_records,
        )
        for v in range(ring.vnodes)
    ]


# What a Spark task does with the batches it read (ARROW_RECORD_SCHEMA, or the query's own
# columns for tasks not `as_records`): batches of the DataFrame's schema.
BatchMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def map_read(
    spark: SparkSession, tasks: list[ReadTask], function: BatchMap, schema: T.StructType
) -> DataFrame:
    """The DataFrame of `function` applied, in each Spark task, to the rows of its share of
    `tasks` as they are read: a job that acts on each row (gc) does so in the Python worker
    that read it, without handing the rows to the JVM and back."""
    # A few vnodes per Spark task: a task costs more than reading a small vnode.
    slices = max(1, min(len(tasks), spark.sparkContext.defaultParallelism * 2))
    counter = rows_read(spark.sparkContext)
    # Each task gets the numbers of its tasks' entries (the list travels in the function,
    # pickled once: its entries share their query and DSNs).
    numbers = spark.range(0, len(tasks), 1, slices)
    return numbers.mapInArrow(functools.partial(_read_numbered, tasks, counter, function), schema)


def _as_read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return batches


def _read_numbered(
    tasks: list[ReadTask],
    counter: Accumulator[int],
    function: BatchMap,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """mapInArrow's function: numbers of `tasks` -> `function` of the rows of those tasks,
    counted for the job's progress."""
    mine = (tasks[number] for batch in batches for number in batch.column("id").to_pylist())

    def counted() -> Iterator[pa.RecordBatch]:
        for batch in read_batches(mine):
            counter.add(batch.num_rows)
            yield batch

    yield from function(counted())


def read_batches(tasks: Iterable[ReadTask]) -> Iterator[pa.RecordBatch]:
    """Read each task's vnode as Arrow batches (of RECORD_SCHEMA, or the query's own columns
    for a task not `as_records`), on one connection per shard
    inside the shard's snapshot. A vnode that moved to another shard since the job read the
    ring is refused by its old shard (docs/metadata.md, "Shards and vnodes"): it is read on
    its new one, at that shard's present (no snapshot of the job's covers it).

    Each vnode is read in a transaction of its own (joining the same snapshot), so the locks
    its read takes go as soon as it is read: a move's write fence waits for one vnode's read
    at most, never for the rest of the task.

    Connections that end clean are kept for the worker's next task of the same job
    (_IdleReaders): Spark reuses the worker, and connecting costs more than reading a vnode."""
    connections: dict[str, AdbcConnection] = {}
    joined: dict[str, tuple[str, str]] = {}  # shard -> its DSN and the job's snapshot
    clean = False
    try:
        for task in tasks:
            conn = connections.get(task.shard)
            if conn is None:
                conn = _IDLE_READERS.take(task.dsn, task.snapshot)
                if conn is None:
                    conn = arrow_connect(task.shard, task.dsn)
                connections[task.shard] = conn
                joined[task.shard] = (task.dsn, task.snapshot)
            try:
                _join_snapshot(conn, task.snapshot, task.shard)
            except AdbcError as exc:
                raise _arrow_classified(exc, task.shard) from None
            try:
                batches = _read_vnode(conn, task)
            except AdbcError as exc:
                if not vnode_gone(exc):
                    raise _arrow_classified(exc, task.shard) from None
                _statement(conn, "ROLLBACK")  # the failed statement ended the transaction
                yield from _read_moved(task)
                continue
            yield from batches
            try:
                _statement(conn, "ROLLBACK")  # read only: ends the vnode's transaction, its locks
            except AdbcError as exc:
                raise _arrow_classified(exc, task.shard) from None
        clean = True
    finally:
        for shard, conn in connections.items():
            if clean:
                _IDLE_READERS.keep(*joined[shard], conn)
            else:
                conn.close()


# Bounds what a long-lived worker (one Spark session running many jobs, as in the tests)
# holds between jobs on shards it has read.
MAX_IDLE_READERS = 4


class _IdleReaders:
    """A Python worker's reading connections between its tasks: one per shard, for the
    tasks of the job whose snapshot it last joined (a connection of an earlier job is
    closed, not reused), at most MAX_IDLE_READERS (the longest idle is closed first); all
    closed when the worker exits."""

    def __init__(self) -> None:
        self.idle: dict[str, tuple[str, AdbcConnection]] = {}  # DSN -> snapshot, connection
        atexit.register(self.close)

    def take(self, dsn: str, snapshot: str) -> AdbcConnection | None:
        kept = self.idle.pop(dsn, None)
        if kept is None:
            return None
        if kept[0] != snapshot:
            kept[1].close()
            return None
        return kept[1]

    def keep(self, dsn: str, snapshot: str, conn: AdbcConnection) -> None:
        earlier = self.idle.pop(dsn, None)
        if earlier is not None:
            earlier[1].close()
        self.idle[dsn] = (snapshot, conn)
        while len(self.idle) > MAX_IDLE_READERS:
            oldest = next(iter(self.idle))
            self.idle.pop(oldest)[1].close()

    def close(self) -> None:
        for _, conn in self.idle.values():
            with contextlib.suppress(Exception):
                conn.close()
        self.idle.clear()


_IDLE_READERS = _IdleReaders()


def _read_vnode(conn: AdbcConnection, task: ReadTask) -> Iterator[pa.RecordBatch]:
    """The batches of the task's vnode. The statement is sent before the first batch is
    asked for, so that a vnode that moved fails here, not halfway through its rows."""
    schema = sql.Identifier(vnode_schema(task.vnode)).as_string(None)
    cursor = conn.cursor()
    try:
        cursor.execute(task.query.replace("{schema}", schema))
        reader = cursor.fetch_record_batch()
    except BaseException:
        cursor.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for batch in _batches_of(reader, task.shard):
                yield _with_place(batch, task) if task.as_records else batch
        finally:
            cursor.close()

    return batches()


def _batches_of(reader: pa.RecordBatchReader, shard: str) -> Iterator[pa.RecordBatch]:
    """The reader's batches; a shard that stops mid-read is named (libpq's error)."""
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except OSError as exc:
            raise _arrow_classified(exc, shard) from None
        yield batch


def _with_place(batch: pa.RecordBatch, task: ReadTask) -> pa.RecordBatch:
    """The query's columns, after the shard and vnode they were read from, as RECORD_SCHEMA:
    headers a map, and no sharks an empty list (as the gateway reads them)."""
    columns = [
        pa.repeat(pa.scalar(task.shard, pa.string()), batch.num_rows),
        pa.repeat(pa.scalar(task.vnode, pa.int32()), batch.num_rows),
        *batch.columns,
    ]
    names = ARROW_RECORD_SCHEMA.names
    headers, sharks = names.index("headers"), names.index("sharks")
    columns[headers] = _map_of_pairs(columns[headers])
    columns[sharks] = pc.fill_null(
        columns[sharks].cast(pa.list_(pa.string())), pa.scalar([], pa.list_(pa.string()))
    )
    return pa.RecordBatch.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, ARROW_RECORD_SCHEMA, strict=True)],
        schema=ARROW_RECORD_SCHEMA,
    )


def _map_of_pairs(pairs: pa.Array) -> pa.MapArray:
    """hstore_to_array's lists (key, value, key, value...) as a map array; NULL stays NULL."""
    pairs = pairs.cast(pa.list_(pa.string()))
    keys = pc.list_slice(pairs, 0, None, 2)
    values = pc.list_slice(pairs, 1, None, 2)
    return pa.MapArray.from_arrays(
        keys.offsets, keys.flatten(), values.flatten(), mask=pairs.is_null()
    )


def _read_moved(task: ReadTask) -> Iterator[pa.RecordBatch]:
    """The batches of a vnode that moved away from `task.shard`, read on its present shard."""
    owner = new_owner(dict(task.shards), task.vnode, task.shard)
    moved = replace(task, shard=owner, dsn=dict(task.shards)[owner])
    conn = arrow_connect(moved.shard, moved.dsn)
    try:
        _statement(conn, _BEGIN_READ)
        yield from _read_vnode(conn, moved)
    finally:
        conn.close()


# How long a reader that met a vnode between its move's fence and switch waits for the switch
# (past the mover's own catch-up bound, moves.CATCH_UP_SECONDS), and how often it looks.
MOVED_VNODE_WAIT_SECONDS = 30.0
MOVED_VNODE_POLL_SECONDS = 0.05


def new_owner(dsns: dict[str, str], vnode: int, old: str) -> str:
    """The shard that holds `vnode` now that shard `old` refused it (`dsns`: every shard of
    the job, the catalog first). Between a move's fence and its switch the ring still names
    the old shard: wait for the switch, which follows within the mover's catch-up time."""
    deadline = time.monotonic() + MOVED_VNODE_WAIT_SECONDS
    catalog_dsn = next(iter(dsns.values()))
    with psycopg.connect(catalog_dsn, autocommit=True, connect_timeout=CONNECT_SECONDS) as catalog:
        while True:
            placed = catalog.execute(queries.SELECT_RING).fetchall()
            owner: str = next(shard for _, v, shard in placed if v == vnode)
            if owner != old:
                break
            if time.monotonic() >= deadline:
                raise psycopg.OperationalError(
                    f"vnode {vnode} is being moved from shard {owner}: run the job again"
                )
            time.sleep(MOVED_VNODE_POLL_SECONDS)
    if owner not in dsns:
        raise psycopg.OperationalError(
            f"vnode {vnode} moved to shard {owner}, which this job does not know: run the job again"
        )
    return owner


def arrow_connect(shard: str, dsn: str) -> AdbcConnection:
    """An ADBC connection to a shard, in autocommit: transactions are begun by statement, so
    that the first statement of one can be SET TRANSACTION SNAPSHOT."""
    try:
        conn: AdbcConnection = adbc_postgresql.connect(dsn, autocommit=True)
        return conn
    except AdbcError as exc:
        raise _arrow_classified(exc, shard) from None


def _statement(conn: AdbcConnection, statement: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute(statement)


_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


def _join_snapshot(
    conn: psycopg.Connection[Any] | AdbcConnection, snapshot: str, shard: str
) -> None:
    """Begin a read-only transaction that sees exactly the driver's exported snapshot."""
    join = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)).as_string(None)
    try:
        if isinstance(conn, psycopg.Connection):
            conn.execute(_BEGIN_READ)
            conn.execute(join)
            return
        _statement(conn, _BEGIN_READ)
        _statement(conn, join)
    except (psycopg.Error, AdbcError) as exc:
        if exc.sqlstate == UNDEFINED_OBJECT:
            raise MetadataUnavailable(
                f"shard {shard} lost the snapshot this job reads (its PostgreSQL restarted, or "
                "ended the driver's connection, during the job): run the job again"
            ) from None
        raise


# The SQLSTATE of SET TRANSACTION SNAPSHOT naming a snapshot that is no more: its exporting
# transaction ended (a PostgreSQL restart ends them all).
UNDEFINED_OBJECT = "42704"

# What ADBC and libpq put before the server's or libpq's own words.
_ADBC_PREFIXES = ("IO: ", "[libpq] ", "Execution error [PGRES_FATAL_ERROR]: ")


def _arrow_classified(exc: Exception, shard: str) -> Exception:
    """What to raise for an error of ADBC's (or of its batch reader, an OSError) met on
    `shard`: the shard named when the connection failed (never connected, or dropped
    mid-read), as `classified` does for psycopg; `exc` itself when a statement failed."""
    text = str(exc).strip()
    reason = " ".join((text.splitlines() or [type(exc).__name__])[0].split())
    for prefix in _ADBC_PREFIXES:
        reason = reason.removeprefix(prefix)
    reason = reason.replace("Failed to connect: ", "connection failed: ", 1)
    if isinstance(exc, AdbcError):
        failed = isinstance(exc, AdbcOperationalError) and lost_connection(exc.sqlstate)
    else:  # the reader's: the server's ERROR is a statement's, anything else the link's
        failed = "ERROR:" not in text
    return MetadataUnavailable(f"shard {shard} is unreachable: {reason}") if failed else exc


def run_async(coroutine: Any) -> Any:
    """Executors are plain Python processes: each batch of node I/O gets its own loop."""
    return asyncio.run(coroutine)


# -- executor-side effects --------------------------------------------------------------------


def node_access(config: Config) -> ClientSettings:
    """What executors need to call storage nodes (the secret, the nodes' CA): given to them
    by value, as they may run on hosts without the configuration."""
    return ClientSettings(load_or_create_secret(config.secret_file), config.storage.tls_ca)


FAULT_AFTER_ENV = "SHOAL_GC_FAULT_AFTER"
DELETE_BATCH = 1000
# Delete requests in flight per node from one task: overlaps one batch's HTTP round trip and
# JSON with the node's unlinks of the previous one.
DELETES_IN_FLIGHT = 4

# What one delete request to a node did: the keys of the blocks it named, whether they are all
# gone now (False when the node failed or is unknown), the node's own count of block replicas
# it removed (the rest of the batch was already missing), the node, and why it failed ("" when
# it did not).
BatchOutcome = tuple[list[Any], bool, int, str, str]


def delete_blocks(
    rows: Iterable[tuple[str, str, str, Any]], access: ClientSettings
) -> Iterator[BatchOutcome]:
    """(shark, url, block name, record key) -> one BatchOutcome per request of <= 1,000 names.

    A node that fails a batch marks its blocks not gone, so their records stay for a later
    run, and is sent none of its later batches (they fail with its reason): a node that
    hangs costs a task seconds once, not for each batch. A block already missing counts as
    gone.
    """
    by_node: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    for shark, url, name, key in rows:
        by_node.setdefault((shark, url), []).append((name, key))
    fault_after = fault_after_requests()
    calls = 0
    for (shark, url), blocks in by_node.items():
        batches = [blocks[i : i + DELETE_BATCH] for i in range(0, len(blocks), DELETE_BATCH)]
        failed = ""  # why the node failed a batch: its later batches are not sent
        for first in range(0, len(batches), DELETES_IN_FLIGHT):
            group = batches[first : first + DELETES_IN_FLIGHT]
            if failed:
                for batch in group:
                    yield [key for _, key in batch], False, 0, shark, failed
                continue
            names = [[n for n, _ in b] for b in group]
            deleted = run_async(_delete_batches(access, shark, url, names))
            for batch, count in zip(group, deleted, strict=True):
                calls += 1
                if fault_after is not None and calls >= fault_after:
                    import os

                    os._exit(3)  # fault injection: a crash after K delete requests
                keys = [key for _, key in batch]
                if isinstance(count, str):
                    failed = failed or count
                    yield keys, False, 0, shark, count
                else:
                    yield keys, True, count, shark, ""


async def _delete_batches(
    access: ClientSettings, shark: str, url: str, batches: list[list[str]]
) -> list[int | str]:
    """Send the batches to one node at once; per batch the node's count, or why it failed.
    A node that hangs fails them within seconds (BlockClient.while_answering)."""
    from shoal.storage import NodeError

    if not url:
        return ["the node is not in the registry"] * len(batches)
    client = access.client()

    async def one(names: list[str]) -> int | str:
        try:
            return await client.delete_blocks(url, names)
        except NodeError as exc:
            return str(exc) or type(exc).__name__

    try:
        sending = asyncio.gather(*(one(names) for names in batches))
        return list(await client.while_answering(url, sending, shark))
    finally:
        await client.close()


class Remover:
    """Removes reclaimed rows (their blocks all gone) from the shards, for one task, on one
    connection per shard, keeping nothing per row in memory.

    Deletion records are staged on the shard (`garbage.stage_reclaimed`) and removed a window
    at a time by `finish` (`garbage.clear_staged_window`): a window holding nothing else is
    truncated whole, others lose their rows by id and are listed to be vacuumed. Rows of
    deleted buckets are deleted by id at once, in statements of DELETE_BATCH ids.
    """

    def __init__(self, dsns: dict[str, str]) -> None:
        self.dsns = dsns
        self.connections: dict[str, psycopg.Connection[Any]] = {}
        self.staged: set[tuple[str, int, str]] = set()  # (shard, vnode, window)
        self.removed = 0

    def records(self, shard: str, rows: Sequence[tuple[int, str, str]]) -> None:
        """Stage deletion records (vnode, window, id) of one shard."""
        from shoal.metadata.garbage import stage_reclaimed

        if rows:
            stage_reclaimed(self._connection(shard), rows)
            self.staged.update((shard, vnode, window) for vnode, window, _ in rows)

    def bucket_rows(
        self, shard: str, vnode: int, kind: str, owner: str, bucket_id: str, ids: Sequence[str]
    ) -> None:
        """Delete rows (kind bucket_object or bucket_part) of a deleted bucket incarnation."""
        from shoal.metadata.shards import render

        statement = render(
            queries.REMOVE_BUCKET_OBJECTS
            if kind == "bucket_object"
            else queries.REMOVE_BUCKET_PARTS,
            vnode,
        )
        conn = self._connection(shard)
        for first in range(0, len(ids), DELETE_BATCH):
            params = {
                "ids": ids[first : first + DELETE_BATCH],
                "owner": owner,
                "bucket_id": bucket_id,
            }
            try:
                self.removed += conn.execute(statement, params).rowcount
            except psycopg.Error as exc:
                if not vnode_gone(exc):
                    raise
                shard = new_owner(self.dsns, vnode, shard)  # the vnode moved since it was read
                conn = self._connection(shard)
                self.removed += conn.execute(statement, params).rowcount

    def finish(self) -> tuple[int, list[tuple[str, int, str]]]:
        """Clear every window staged: (windows truncated whole, windows to vacuum as
        (shard, vnode, window))."""
        from shoal.metadata.garbage import clear_staged_window

        truncated = 0
        to_vacuum: list[tuple[str, int, str]] = []
        for shard in {shard for shard, _, _ in self.staged}:
            self._connection(shard).execute(queries.INDEX_RECLAIMED)
            self._connection(shard).execute(queries.ANALYZE_RECLAIMED)  # a plan for its size
        for shard, vnode, window in sorted(self.staged):
            try:
                cleared = clear_staged_window(self._connection(shard), vnode, window)
            except psycopg.Error as exc:
                if not vnode_gone(exc):
                    raise
                shard, cleared = self._follow(shard, vnode, window)
            self.removed += cleared.removed
            if cleared.whole:
                truncated += 1
            else:
                to_vacuum.append((shard, vnode, window))
        self.staged.clear()
        return truncated, to_vacuum

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        self.connections.clear()

    def _follow(self, shard: str, vnode: int, window: str) -> tuple[str, WindowClearing]:
        """Clear a window whose vnode moved away from `shard` since its records were read:
        its staged records are staged again on the shard that holds the vnode now, and
        removed there (the move copied them, or they were removed before it)."""
        from shoal.metadata.garbage import clear_staged_window, stage_reclaimed

        params = {"vnode": vnode, "window": window}
        rows = self._connection(shard).execute(queries.STAGED_RECLAIMED, params).fetchall()
        owner = new_owner(self.dsns, vnode, shard)
        conn = self._connection(owner)
        stage_reclaimed(conn, rows)
        return owner, clear_staged_window(conn, vnode, window)

    def _connection(self, shard: str) -> psycopg.Connection[Any]:
        conn = self.connections.get(shard)
        if conn is None:
            conn = self.connections[shard] = connect(shard, self.dsns[shard])
        return conn


def fault_after_requests() -> int | None:
    """The test hook SHOAL_GC_FAULT_AFTER: exit after this many delete requests."""
    import os

    value = os.environ.get(FAULT_AFTER_ENV)
    return int(value) if value else None


# -- storage node inventories and block checks -----------------------------------------------

INVENTORY_SCHEMA = T.StructType(
    [
        T.StructField("shark", T.StringType(), False),
        T.StructField("name", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("checksum", T.StringType(), False),
        T.StructField("mtime", T.DoubleType(), False),
    ]
)

# Rows of open multipart uploads' parts, as records (their blocks are live).
LIVE_PARTS = OPEN_PARTS


# How long the driver gives each node to answer its /status before a job leaves it out.
ANSWER_SECONDS = 3.0


def answering_nodes(
    urls: dict[str, str], access: ClientSettings
) -> tuple[dict[str, str], list[str]]:
    """The nodes of `urls` that answer their /status now, and the sharks of those that do
    not (down, hung, or another process at their address). A job reads the first and
    reports the others, rather than fail whole for a node that is down and not yet marked
    dead; one that stops answering after this still fails the job, naming it."""

    async def ask() -> set[str]:
        client = access.client()
        try:
            return await client.answering(urls, ANSWER_SECONDS)
        finally:
            await client.close()

    answers = run_async(ask())
    answering = {shark: url for shark, url in urls.items() if shark in answers}
    return answering, sorted(shark for shark in urls if shark not in answers)


def read_inventories(
    spark: SparkSession, urls: dict[str, str], access: ClientSettings
) -> DataFrame:
    """Every block of every node, one Spark task per node."""
    nodes = sorted(urls.items())
    rdd = spark.sparkContext.parallelize(nodes, max(1, len(nodes))).mapPartitions(
        lambda part: _inventory(part, access)
    )
    return spark.createDataFrame(rdd, INVENTORY_SCHEMA)


def _inventory(
    nodes: Iterable[tuple[str, str]], access: ClientSettings
) -> Iterator[tuple[Any, ...]]:
    from shoal.storage import NodeError

    async def collect(shark: str, url: str) -> list[tuple[Any, ...]]:
        client = access.client()

        async def pages() -> list[tuple[Any, ...]]:
            return [
                (shark, b.name, b.size, b.checksum, b.mtime)
                async for b in client.inventory(url, page_size=5000)
            ]

        try:
            # A node that hangs fails the task within seconds (BlockClient.while_answering).
            return await client.while_answering(url, pages(), shark)
        except NodeError as exc:
            raise NodeError(shark, f"its inventory could not be read: {exc}") from None
        finally:
            await client.close()

    for shark, url in nodes:
        yield from run_async(collect(shark, url))


# Block reads in flight per task: a node serves many reads at once, and one read at a time
# leaves both the node and the task waiting on round trips.
READS_IN_FLIGHT = 32
VERIFY_CHUNK = 2000


def verify_blocks(
    rows: Iterable[tuple[str, str, str]], access: ClientSettings
) -> Iterator[tuple[str, str, str]]:
    """(shark, url, name) -> (shark, name, verdict): ok, corrupt, wrong size, missing or
    unreachable.

    Each block is read whole and checked against its checksum by the client; up to
    READS_IN_FLIGHT reads at once, on one connection pool for the task. A node that answers
    with an error about the block itself holds a bad replica ("wrong size" when its file is
    shorter than its header says, "corrupt" otherwise); "unreachable" is only for a node
    that gave no whole answer, and for the node's blocks read after that in the task.
    """
    from shoal.storage import BlockCorrupted, BlockMissing, NodeError, NodeUnreachable

    client = access.client(connections_per_node=READS_IN_FLIGHT)
    gate = asyncio.Semaphore(READS_IN_FLIGHT)  # binds to the loop below at first use
    # Nodes that gave no answer in this task: their other blocks are "unreachable" at once,
    # so that a node that hangs costs the task seconds once, not a wait for each read.
    silent: set[str] = set()

    async def check(shark: str, url: str, name: str) -> tuple[str, str, str]:
        async with gate:
            if shark in silent:
                return shark, name, "unreachable"
            try:
                await client.while_answering(url, client.get_block(url, name), shark)
                verdict = "ok"
            except BlockCorrupted:
                verdict = "corrupt"
            except BlockMissing:
                verdict = "missing"
            except NodeUnreachable:
                silent.add(shark)
                verdict = "unreachable"
            except NodeError as exc:
                verdict = _bad_replica(exc)
        return shark, name, verdict

    async def check_all(chunk: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        return list(await asyncio.gather(*(check(*row) for row in chunk)))

    # One event loop for the task, so the client's connections are kept between chunks.
    loop = asyncio.new_event_loop()
    try:
        chunk: list[tuple[str, str, str]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= VERIFY_CHUNK:
                yield from loop.run_until_complete(check_all(chunk))
                chunk = []
        if chunk:
            yield from loop.run_until_complete(check_all(chunk))
    finally:
        loop.run_until_complete(client.close())
        loop.close()


# How a node words a block file cut short (storage/blockfile.py, BlockCorrupt).
_SHORT_FILE = ("shorter than its header says", "truncated header")


def _bad_replica(error: Exception) -> str:
    """The verdict on a replica the node answered for with an error."""
    return "wrong size" if any(words in str(error) for words in _SHORT_FILE) else "corrupt"


OPEN_UPLOADS = """
SELECT 'upload', id::text, owner::text, bucket_id::text, name, created, 0::bigint, NULL::bytea,
       content_type, NULL::text[], NULL::text[], properties::text, NULL::timestamptz
FROM {schema}.manta_bucket_upload
"""
