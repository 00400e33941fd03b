"""What `shoal pipeline` says while it runs, where there is no terminal: progress lines per
phase on stderr (through the log), then one final line per phase with its counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.config import MetadataConfig
from shoal.metadata import MetadataStore, ObjectWrite, migrate
from shoal.pipeline.progress import INTERVAL_ENV
from tests.fixtures.postgres import create_databases

SHOAL = str(Path(sys.executable).parent / "shoal")
OBJECTS = 30


@pytest.fixture
def small_world(admin_dsn: str, run: Callable[[Awaitable[Any]], Any], tmp_path: Path) -> Path:
    """A config file naming one migrated shard (4 vnodes) holding OBJECTS objects."""
    shards = create_databases(admin_dsn, 1)
    run(migrate(shards, MetadataConfig(vnodes=4, partitions_ahead=1)))

    async def fill() -> None:
        async with await MetadataStore.open(shards, 2) as store:
            account = await store.accounts.create("progress")
            await store.buckets.create(account.id, "watched")
            for index in range(OBJECTS):
                write = ObjectWrite(10, b"m" * 16, sharks=["dc0:n0"])
                await store.objects.put(account.id, "watched", f"o{index}", write)

    run(fill())
    config = tmp_path / "shoal.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[metadata]\nvnodes = 4\n'
        f'[[metadata.shards]]\nname = "{shards[0].name}"\ndsn = "{shards[0].dsn}"\n'
    )
    return config


@pytest.mark.slow
def test_a_job_without_a_terminal_writes_progress_lines_per_phase(small_world: Path) -> None:
    result = subprocess.run(
        [SHOAL, "pipeline", "meter", "--config", str(small_world), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, INTERVAL_ENV: "0.2"},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if " shoal.pipeline meter: " in line]
    ending = re.compile(r"meter: (?P<phase>[\w ]+): done, (?P<counts>.*) in [\d.]+ s$")
    final = {match["phase"]: match for line in lines if (match := ending.search(line))}
    assert list(final) == ["read metadata", "write history"], lines
    counts = final["read metadata"]["counts"]
    tasks = re.search(r"(\d+) tasks", counts)
    rows = re.search(r"([\d,]+) rows", counts)
    assert tasks is not None and int(tasks[1]) >= 1, counts
    assert rows is not None and int(rows[1].replace(",", "")) >= OBJECTS, counts
    # Lines while a phase runs say done/total, a rate and the time left (or so far).
    running = [line for line in lines if ": done, " not in line]
    for line in running:
        assert re.search(r"meter: (read metadata|write history): ", line), line
        assert re.search(r"(\d+/\d+ tasks|started)", line) and re.search(r"(left|so far)$", line)
    assert "[Stage" not in result.stderr  # Spark's own console bar stays off
