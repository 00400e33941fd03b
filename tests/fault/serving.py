"""A `shoal serve` of a fault test's own (the session's `served` must never be broken), and
what a test reads of it afterwards: the block files on its nodes, the versions its rows name."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.fixtures.serve import Served, start_serve, stop_serve

# Every version id a shard's rows name: live objects, their parts, open uploads' parts and
# deletion records (what `shoal pipeline orphans` counts as referenced).
_NAMED = """
SELECT id FROM {schema}.manta_bucket_object
UNION ALL SELECT (p->>'id')::uuid FROM {schema}.manta_bucket_object,
    jsonb_array_elements(properties->'parts') AS p
UNION ALL SELECT id FROM {schema}.manta_bucket_deleted_object
UNION ALL SELECT id FROM {schema}.manta_bucket_upload_part
"""


# A test's serve runs no pipeline job on its own: one due while the suite runs (a run
# across 00:30 UTC, say) would start Spark in the middle of a fault test.
NO_SCHEDULE = "\n[pipeline]\nscheduled = false\n"
# A fresh serve makes every vnode's schema at its first start; the default's 64 cost it several
# seconds of CPU more than this many. Tests about the vnodes set [metadata] themselves.
FEW_VNODES = "[metadata]\nvnodes = 8\n"


@contextlib.contextmanager
def own_serve(folder: Path, config: str = "") -> Iterator[Served]:
    """`shoal serve` with its data directory in `folder` and `config` added to its
    configuration file (with FEW_VNODES unless `config` has a [metadata] table); stopped
    (SIGINT) at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / "shoal.toml"
    vnodes = "" if re.search(r"^\[metadata\]$", config, re.MULTILINE) else FEW_VNODES
    schedule = "" if "[pipeline]" in config else NO_SCHEDULE
    config_file.write_text(f'data_dir = "data"\n{vnodes}{config}\n{schedule}')
    process, served = start_serve(config_file, folder / "serve.log")
    try:
        yield served
    finally:
        stop_serve(process)


def block_versions(data_dir: Path) -> set[uuid.UUID]:
    """The versions with a block file on any of the serve's local nodes."""
    files = (data_dir / "nodes").glob("*/blocks/*/*")
    return {uuid.UUID(f.name.split(".")[0]) for f in files}


def named_versions(dsn: str) -> set[uuid.UUID]:
    """The versions the rows of a shard name (every vnode schema of its database)."""
    named: set[uuid.UUID] = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        schemas = [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'manta\\_bucket\\_%'"
            )
        ]
        for schema in schemas:
            named.update(row[0] for row in conn.execute(_NAMED.format(schema=schema)))
    return named
