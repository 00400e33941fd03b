"""`shoal pipeline inventory`: every live object of every bucket, like S3 Inventory; and the
reports of the buckets' inventory configurations, delivered into their destination buckets.

The whole-store report, for operators, per bucket, Parquet and CSV under the run's output:
key, size, ETag, last modified, content type (as HEAD answers it), storage nodes, tags (a
JSON map of key to value; empty for an object without tags).

Then, for every enabled configuration that is due (shoal.inventory.is_due; `force` delivers
every enabled one, `bucket` only a source bucket's), its report as S3 delivers one, into the
destination bucket, as normal objects (docs/pipeline.md, "Inventory reports"):

    <prefix>/<source>/<id>/data/<uuid>.csv.gz | .parquet
    <prefix>/<source>/<id>/<YYYY-MM-DDTHH-MMZ>/manifest.json, manifest.checksum
    <prefix>/<source>/<id>/hive/dt=<YYYY-MM-DD-HH-MM>/symlink.txt

Read from one snapshot per shard, so a report is one consistent instant of each shard. The
driver writes the report files (rows stream to it a partition at a time) and puts them
through the data path and the metadata API, as the gateway puts an object.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import logging
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from shoal import inventory as spec
from shoal.metadata import BucketNotFound, MetadataError
from shoal.metadata.inventories import InventorySetting
from shoal.metadata.models import etag
from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary
from shoal.pipeline.progress import Phase
from shoal.pipeline.publish import put_object
from shoal.s3.headers import DEFAULT_CONTENT_TYPE
from shoal.storage import DataUnavailable, StorageUnavailable

log = logging.getLogger("shoal.pipeline")

ROWS_PER_FILE = 1_000_000  # a report's data file holds at most this many objects
PARQUET_BATCH = 10_000
MANIFEST_VERSION = "2016-11-30"
ARN_PREFIX = "arn:aws:s3:::"
EXTENSIONS = {"CSV": ".csv.gz", "Parquet": ".parquet"}
CONTENT_TYPES = {"CSV": "application/x-gzip", "Parquet": "application/octet-stream"}


def run(ctx: JobContext) -> Summary:
    settings: list[InventorySetting] = ctx.with_store(lambda store: store.inventories.all())
    due, not_due = _due(settings, ctx.options.get("bucket"), bool(ctx.options.get("force")))
    folder = ctx.output / "deliveries"
    ctx.progress.begin("read objects")
    with io.exported_snapshots(ctx.shards) as snapshots:
        buckets = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.BUCKETS)
        # Each task makes its rows' report columns where it read them; only those columns
        # reach the JVM.
        tasks = io.read_tasks(
            ctx.shards, ctx.ring, snapshots, io.INVENTORY_OBJECTS, as_records=False
        )
        names = {bucket_id: name for bucket_id, _, name in buckets}
        # Kept sorted by bucket: both writes below split their files by bucket, and find
        # the rows already in that order instead of sorting them each.
        everything = (
            io.map_read(
                ctx.spark, tasks, functools.partial(report_rows, names=names), REPORT_SCHEMA
            )
            .sortWithinPartitions("bucket")
            .cache()
        )
        count = everything.count()
        reports = _write_reports(ctx, snapshots, due, folder)
    ctx.progress.begin("write inventory")
    everything.write.mode("overwrite").partitionBy("bucket").parquet(str(ctx.output / "parquet"))
    everything.write.mode("overwrite").partitionBy("bucket").option("header", True).csv(
        str(ctx.output / "csv")
    )
    totals = everything.agg(
        F.countDistinct("bucket").alias("buckets"), F.sum("size").alias("bytes")
    ).first()
    assert totals is not None  # an aggregate's one row
    delivering = ctx.progress.begin("deliver reports", total=len(reports), unit="reports")
    problems = (
        ctx.with_store(lambda store: _deliver(ctx, store, reports, delivering)) if reports else []
    )
    # Delivered ones are in their buckets; an undelivered one is written again when next due.
    shutil.rmtree(folder, ignore_errors=True)
    return Summary(
        "inventory",
        {
            "buckets": int(totals["buckets"] or 0),
            "objects": count,
            "bytes": int(totals["bytes"] or 0),
            "reports delivered": len(reports) - len(problems),
            "reports not due": not_due,
        },
        ctx.output,
        problems,
    )


# The whole-store report's columns.
REPORT_SCHEMA = T.StructType(
    [
        T.StructField("bucket", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("etag", T.StringType()),
        T.StructField("last_modified", T.TimestampType()),
        T.StructField("content_type", T.StringType()),
        T.StructField("storage_nodes", T.StringType()),
        T.StructField("tags", T.StringType()),
    ]
)
ARROW_REPORT_SCHEMA = to_arrow_schema(REPORT_SCHEMA, timezone="UTC")


def report_rows(
    batches: Iterator[pa.RecordBatch], names: dict[str, str]
) -> Iterator[pa.RecordBatch]:
    """The report's rows of a task's batches (io.INVENTORY_OBJECTS), on Arrow's columns:
    an object of a bucket not in `names` (bucket id -> name: the buckets of the job's
    snapshot) is left out."""
    for batch in batches:
        # The batch's few buckets looked up, not every bucket of the store.
        ids = pc.unique(batch.column("bucket_id"))
        found = pa.array([names.get(i) for i in ids.to_pylist()], pa.string())
        bucket = pc.take(found, pc.index_in(batch.column("bucket_id"), value_set=ids))
        known = pc.is_valid(bucket)
        parts = batch.column("parts")
        etag = pc.if_else(
            pc.is_null(parts),
            hex_of(batch.column("content_md5")),
            pc.binary_join_element_wise(
                hex_of(batch.column("content_md5")), pc.cast(parts, pa.string()), "-"
            ),
        )
        content_type = batch.column("content_type")
        sharks = pc.fill_null(batch.column("sharks"), pa.scalar([], pa.list_(pa.string())))
        columns = [
            bucket,
            batch.column("name"),
            batch.column("content_length"),
            etag,
            batch.column("created"),
            # What HEAD answers: an object stored without a type is binary/octet-stream.
            pc.if_else(
                pc.fill_null(pc.not_equal(content_type, ""), False),
                content_type,
                DEFAULT_CONTENT_TYPE,
            ),
            pc.binary_join(sharks, " "),
            pc.fill_null(batch.column("tags"), ""),
        ]
        report = pa.RecordBatch.from_arrays(
            [c.cast(f.type) for c, f in zip(columns, ARROW_REPORT_SCHEMA, strict=True)],
            schema=ARROW_REPORT_SCHEMA,
        )
        yield report.filter(known)


def hex_of(digests: pa.Array) -> pa.Array:
    """Lower-case hex of each binary value, NULL staying NULL: one bytes.hex() of the
    array's data, and its offsets doubled."""
    digests = digests.cast(pa.binary())
    if len(digests) == 0:
        return pa.array([], pa.string())
    _, offsets, data = digests.buffers()
    start = digests.offset
    ends = np.frombuffer(offsets, np.int32)[start : start + len(digests) + 1]
    first = int(ends[0])
    text = data.to_pybytes()[first : int(ends[-1])].hex().encode() if data else b""
    strings = pa.StringArray.from_buffers(
        len(digests),
        pa.py_buffer(((ends - first) * 2).astype(np.int32).tobytes()),
        pa.py_buffer(text),
    )
    return pc.if_else(pc.is_valid(digests), strings, pa.scalar(None, pa.string()))


def _due(
    settings: list[InventorySetting], only: str | None, force: bool
) -> tuple[list[InventorySetting], int]:
    """The enabled configurations to deliver now, and how many enabled ones are not due."""
    enabled = [
        s for s in settings if s.configuration["enabled"] and (only is None or s.bucket == only)
    ]
    due = [
        s for s in enabled if force or spec.is_due(s.configuration["frequency"], s.delivered, s.now)
    ]
    return due, len(enabled) - len(due)


# -- writing a report -------------------------------------------------------------------------


@dataclass
class Report:
    """One configuration's report, written on the driver, waiting to be delivered."""

    setting: InventorySetting
    columns: list[spec.Column]
    files: list[Path] = field(default_factory=list)

    @property
    def format(self) -> str:
        return str(self.setting.configuration["destination"]["format"])


def _write_reports(
    ctx: JobContext, snapshots: dict[str, str], due: list[InventorySetting], folder: Path
) -> list[Report]:
    if not due:
        return []
    wanted = sorted({str(s.bucket_id) for s in due})
    rows = io.read_rows(
        ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS_OF_BUCKETS, wanted=wanted
    )
    rows = rows.cache()  # read once, whatever the number of configurations of a bucket
    reports = []
    writing = ctx.progress.begin("write reports", total=len(due), unit="reports")
    for setting in due:
        report = Report(setting, spec.columns(setting.configuration))
        items = (_item(setting.bucket, row) for row in _objects_of(rows, setting))
        _write_files(report, items, folder / str(setting.bucket_id) / setting.id)
        reports.append(report)
        writing.advance()
    rows.unpersist()
    return reports


def _objects_of(rows: Any, setting: InventorySetting) -> Any:
    """The rows of a configuration's report, streamed to the driver a partition at a time."""
    chosen = rows.filter(F.col("bucket_id") == str(setting.bucket_id))
    prefix = setting.configuration.get("prefix")
    if prefix:
        chosen = chosen.filter(F.col("name").startswith(prefix))
    return chosen.toLocalIterator()


def _item(bucket: str, row: Any) -> spec.InventoryObject:
    properties = json.loads(row.properties) if row.properties else {}
    parts = properties.get("parts")
    checksums = properties.get("checksums") or {}
    return spec.InventoryObject(
        bucket=bucket,
        key=row.name,
        size=int(row.content_length or 0),
        last_modified=row.created.astimezone(UTC),  # Spark gives it in local time
        etag=etag(bytes(row.content_md5 or b""), len(parts) if parts is not None else None),
        multipart=parts is not None,
        checksum_algorithm=sorted(checksums)[0].upper() if checksums else "",
        public_read=properties.get("acl") == "public-read",
        owner=row.owner,
    )


def _write_files(report: Report, items: Any, folder: Path) -> None:
    """The report's data files, at most ROWS_PER_FILE objects each (one, maybe empty, at
    least: a reader always finds the schema)."""
    folder.mkdir(parents=True, exist_ok=True)
    writer: _FileWriter | None = None
    for item in items:
        if writer is None or writer.rows >= ROWS_PER_FILE:
            if writer is not None:
                writer.close()
            writer = _FileWriter.open(report, folder)
        writer.add(item)
    if writer is None:
        writer = _FileWriter.open(report, folder)
    writer.close()


class _FileWriter:
    """One data file: gzip CSV with every value quoted and no header, or Parquet with S3's
    column names and types."""

    def __init__(self, report: Report, path: Path) -> None:
        self.report = report
        self.path = path
        self.rows = 0
        self.pending: list[spec.InventoryObject] = []
        if report.format == "CSV":
            # Closed by close(), once the report's objects are written.
            self.text = gzip.open(path, "wt", encoding="utf-8", newline="")  # noqa: SIM115
            self.csv = csv.writer(self.text, quoting=csv.QUOTE_ALL, lineterminator="\n")
        else:
            self.schema = pa.schema(
                [
                    pa.field(c.parquet, _ARROW_TYPES[c.kind], nullable=not c.required)
                    for c in report.columns
                ]
            )
            self.parquet = pq.ParquetWriter(str(path), self.schema)
        report.files.append(path)

    @classmethod
    def open(cls, report: Report, folder: Path) -> _FileWriter:
        return cls(report, folder / f"{uuid.uuid4()}{EXTENSIONS[report.format]}")

    def add(self, item: spec.InventoryObject) -> None:
        self.rows += 1
        if self.report.format == "CSV":
            self.csv.writerow([spec.csv_value(c, item) for c in self.report.columns])
            return
        self.pending.append(item)
        if len(self.pending) >= PARQUET_BATCH:
            self._flush()

    def _flush(self) -> None:
        columns = {c.parquet: [c.value(item) for item in self.pending] for c in self.report.columns}
        self.parquet.write_table(pa.table(columns, schema=self.schema))
        self.pending = []

    def close(self) -> None:
        if self.report.format == "CSV":
            self.text.close()
            return
        if self.pending:
            self._flush()
        self.parquet.close()


_ARROW_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
    "boolean": pa.bool_(),
}


# -- delivering it -----------------------------------------------------------------------------


async def _deliver(
    ctx: JobContext, store: Any, reports: list[Report], progress: Phase
) -> list[str]:
    """Put each report into its destination bucket and record the delivery; a report that
    cannot be delivered is a problem, and the others are still delivered."""
    from shoal.cluster import data_path

    path = data_path(ctx.config, store)
    problems = []
    try:
        for report in reports:
            setting = report.setting
            try:
                await _deliver_one(ctx, store, path, report)
            except BucketNotFound:
                destination = setting.configuration["destination"]["bucket"]
                problems.append(
                    f"inventory {setting.id} of bucket {setting.bucket}: destination bucket "
                    f"{destination} does not exist"
                )
            except (MetadataError, StorageUnavailable, DataUnavailable) as exc:
                problems.append(
                    f"inventory {setting.id} of bucket {setting.bucket} not delivered: {exc}"
                )
            else:
                await store.inventories.mark_delivered(setting.bucket_id, setting.id, setting.now)
            progress.advance()
    finally:
        await path.client.close()
    for problem in problems:
        log.warning("%s", problem)
    return problems


async def _deliver_one(ctx: JobContext, store: Any, path: Any, report: Report) -> None:
    setting = report.setting
    destination = setting.configuration["destination"]
    target = destination["bucket"]
    await store.buckets.get(setting.owner, target)  # BucketNotFound: a problem, said once
    inline = ctx.config.s3.inline_max_bytes

    async def put(key: str, body: Path | bytes, content_type: str) -> Any:
        return await put_object(store, path, setting.owner, target, key, body, content_type, inline)

    base = _base(destination.get("prefix"), setting.bucket, setting.id)
    files = []
    for local in report.files:
        files.append(await put(f"{base}/data/{local.name}", local, CONTENT_TYPES[report.format]))
    manifest = json.dumps(_manifest(ctx.started, report, target, files), indent=2).encode()
    stamp = ctx.started.strftime("%Y-%m-%dT%H-%MZ")
    symlinks = "".join(f"s3://{target}/{f.key}\n" for f in files).encode()
    hive = f"{base}/hive/dt={ctx.started.strftime('%Y-%m-%d-%H-%M')}/symlink.txt"
    await put(hive, symlinks, "text/plain")
    await put(f"{base}/{stamp}/manifest.json", manifest, "application/json")
    # Last, as S3 does: a manifest.checksum says the delivery is whole.
    checksum = hashlib.md5(manifest).hexdigest().encode()
    await put(f"{base}/{stamp}/manifest.checksum", checksum, "text/plain")


def _base(prefix: str | None, source: str, config_id: str) -> str:
    prefix = (prefix or "").rstrip("/")
    return f"{prefix}/{source}/{config_id}" if prefix else f"{source}/{config_id}"


def _manifest(started: datetime, report: Report, target: str, files: list[Any]) -> dict[str, Any]:
    """manifest.json as S3 writes it."""
    if report.format == "CSV":
        schema = ", ".join(c.name for c in report.columns)
    else:
        schema = spec.parquet_schema_text(report.columns)
    return {
        "sourceBucket": report.setting.bucket,
        "destinationBucket": ARN_PREFIX + target,
        "version": MANIFEST_VERSION,
        "creationTimestamp": str(int(started.timestamp() * 1000)),
        "fileFormat": report.format,
        "fileSchema": schema,
        "files": [{"key": f.key, "size": f.size, "MD5checksum": f.md5} for f in files],
    }
