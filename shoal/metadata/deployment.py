"""Where the shards are: the embedded server's databases, or the configured DSNs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql

from shoal.config import Config, ShardConfig
from shoal.metadata import queries
from shoal.metadata.embedded import EmbeddedPostgres


def embedded_server(config: Config) -> EmbeddedPostgres:
    return EmbeddedPostgres(config.data_dir / "postgres")


@contextlib.contextmanager
def shard_configs(config: Config) -> Iterator[list[ShardConfig]]:
    """The shards to use for the duration of one command.

    Embedded: the server under the data directory is started for the command unless it already
    runs (beside `shoal serve`), and its shard databases are created if missing.
    """
    if not config.metadata.embedded:
        yield list(config.metadata.shards)
        return
    server = embedded_server(config)
    with server.running():
        yield embedded_shards(server, config.metadata.embedded_shards)


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
