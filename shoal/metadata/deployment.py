"""Where the shards are: the embedded server's databases, or the configured DSNs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql

from shoal.config import Config, ShardConfig
from shoal.metadata import queries
from shoal.metadata.embedded import EmbeddedPostgres
from shoal.metadata.errors import MetadataError


class NoInstance(MetadataError):
    """The data directory holds no Shoal instance (its embedded PostgreSQL was never made)."""


def embedded_server(config: Config) -> EmbeddedPostgres:
    return EmbeddedPostgres(config.data_dir / "postgres")


@contextlib.contextmanager
def shard_configs(config: Config, *, create: bool = False) -> Iterator[list[ShardConfig]]:
    """The shards to use for the duration of one command.

    Embedded: the server under the data directory is started for the command unless it already
    runs (beside `shoal serve`), and its shard databases are created if missing. Only with
    `create` (`serve`, `db migrate`) is a server made where none is: any other command on a
    mistyped data directory raises NoInstance and leaves nothing behind.
    """
    if not config.metadata.embedded:
        yield list(config.metadata.shards)
        return
    if not create:
        require_instance(config)
    server = embedded_server(config)
    with server.running():
        yield embedded_shards(server, config.metadata.embedded_shards)


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
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
        existing = {r[0] for r in conn.execute(queries.DATABASE_NAMES).fetchall()}
        for name in names:
            if name not in existing:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return [ShardConfig(name=name, dsn=server.dsn(name)) for name in names]
