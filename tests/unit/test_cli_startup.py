"""The short commands start light: importing shoal.cli (what every `shoal` process does before
it reads its verb) loads neither the gateway nor the storage nodes' HTTP, nor Spark. The verbs
that run them import them inside (shoal/cli.py says why)."""

from __future__ import annotations

import json
import subprocess
import sys

# Each costs every `shoal db`, `ring`, `shard`, `account` or `node` process time to import.
HEAVY = (
    "aiohttp",
    "awscrt",
    "pyspark",
    "shoal.cluster",
    "shoal.admin",
    "shoal.storage",
    "shoal.s3",
)


def test_importing_the_cli_loads_nothing_heavy() -> None:
    probe = "import json, sys, shoal.cli; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    assert "shoal.cli" in loaded
    assert [module for module in HEAVY if module in loaded] == []
