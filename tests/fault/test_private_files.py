"""A local user without S3 credentials reads nothing of Shoal's: every file and folder under
a served data directory belongs to Shoal's user alone, the pipeline's outputs included."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from shoal.config import load_config
from shoal.metadata.deployment import shard_configs
from shoal.pipeline import run_job
from tests.fixtures.serve import Served

KiB = 1024


@pytest.mark.slow
def test_nothing_under_a_served_data_dir_is_readable_by_other_users(
    served: Served, spark: Any
) -> None:
    """Objects, blocks, PostgreSQL's files, secrets and the pipeline's outputs (which name
    every object) belong to Shoal's user alone: 0700 folders, 0600 files."""
    s3 = served.client()
    s3.create_bucket(Bucket="private-files")
    for index, size in enumerate((10, 8 * KiB, 1536 * KiB)):  # inline, one block, two
        s3.put_object(Bucket="private-files", Key=f"o{index}", Body=os.urandom(size))
    config = load_config(served.data_dir.parent / "shoal.toml", None)
    with shard_configs(config) as shards:
        summary = run_job("inventory", config, shards, spark=spark)
    assert summary.output.is_relative_to(served.data_dir / "pipeline")
    assert any((served.data_dir / "nodes").glob("*/blocks/*/*"))
    modes = {path: mode_of(path) for path in [served.data_dir, *served.data_dir.rglob("*")]}
    readable = [
        f"{oct(mode)} {path.relative_to(served.data_dir)}"
        for path, mode in modes.items()
        if mode is not None and mode & 0o077
    ]
    assert readable == []


def mode_of(path: Path) -> int | None:
    """A file's or folder's permission bits; None for a link, or for a file gone since it
    was listed (the running services make and remove some: a node's readiness probe,
    PostgreSQL's temporary files)."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        return None
    return None if stat.S_ISLNK(status.st_mode) else status.st_mode & 0o777
