"""Where the shards are: the embedded server's databases, or the configured DSNs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql

from shoal.config import Config, ShardConfig
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import queries
from shoal.metadata.embedded import EmbeddedPostgres
from shoal.metadata.errors import MetadataError, SchemaError
from shoal.metadata.shards import CONNECT_TIMEOUT_SECONDS, first_line, unsealed_dsn


class NoInstance(MetadataError):
    """The data directory holds no Shoal instance (its embedded PostgreSQL was never made)."""


def embedded_server(config: Config) -> EmbeddedPostgres:
    return EmbeddedPostgres(config.data_dir / "postgres")


@contextlib.contextmanager
def shard_configs(
    config: Config, *, create: bool = False, owner: bool = False
) -> Iterator[list[ShardConfig]]:
    """The shards to use for the duration of one command: those of the configuration, then
    those `shoal shard add` added (from the catalog, their DSNs unsealed with the
    credentials key).

    Embedded: the server under the data directory is started for the command unless it already
    runs (beside `shoal serve`), and its shard databases are created if missing. Only with
    `create` (`serve`, `db migrate`) is a server made where none is: any other command on a
    mistyped data directory raises NoInstance and leaves nothing behind. The `owner`
    (`serve`) stops the embedded server at the end even if it found it running.
    """
    if not config.metadata.embedded:
        configured = list(config.metadata.shards)
        yield configured + added_shards(config, configured)
        return
    if not create:
        require_instance(config)
    server = embedded_server(config)
    with server.running(owner=owner):
        configured = embedded_shards(server, config.metadata.embedded_shards)
        yield configured + added_shards(config, configured)


def added_shards(config: Config, configured: list[ShardConfig]) -> list[ShardConfig]:
    """The shards the catalog (the first configured shard) lists beyond `configured`."""
    if not configured:
        return []
    try:
        with psycopg.connect(
            configured[0].dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
        ) as conn:
            rows = conn.execute(queries.ADDED_SHARDS).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.OperationalError):
        return []  # not migrated yet, or the catalog is down: the command says so itself
    if not rows:
        return []
    key = load_or_create_secret(config.credentials_key_file)
    known = {shard.name for shard in configured}
    return [
        ShardConfig(name=name, dsn=unsealed_dsn(key, name, sealed))
        for name, sealed in rows
        if name not in known
    ]


def require_instance(config: Config) -> None:
    """Raise NoInstance if the configuration names embedded shards and the data directory
    holds no embedded server (external shards are their operator's to make)."""
    if config.metadata.embedded and not embedded_server(config).is_initialized():
        raise NoInstance(
            f"no Shoal instance in {config.data_dir} "
            "(run `shoal serve` or `shoal db migrate` there first)"
        )


def embedded_shards(server: EmbeddedPostgres, count: int) -> list[ShardConfig]:
    """Shards `shard0` .. `shard<count-1>`: databases of the embedded server."""
    names = [f"shard{i}" for i in range(count)]
    return [ShardConfig(name=name, dsn=create_embedded_database(server, name)) for name in names]


def create_embedded_database(server: EmbeddedPostgres, name: str) -> str:
    """The DSN of database `name` of the embedded server, made if missing. A server that
    does not answer (stopped, hung) is a SchemaError within seconds, never a wait without
    end."""
    try:
        with psycopg.connect(
            server.dsn("postgres"), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
        ) as conn:
            existing = {r[0] for r in conn.execute(queries.DATABASE_NAMES).fetchall()}
            if name not in existing:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as exc:
        raise SchemaError(f"cannot connect to the embedded PostgreSQL: {first_line(exc)}") from None
    return server.dsn(name)
