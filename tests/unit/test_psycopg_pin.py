"""psycopg and psycopg-pool are pinned to exact versions, because the metadata tier's fast
paths use names neither documents (docs/decisions.md, "Prepared statements below psycopg's
cursor"; `bench/psycopg_paths_bench.py` measures them against psycopg's public API).

When either is upgraded, these tests fail and name what to re-check; once it is re-checked
(tests/integration/test_batched_reads.py, test_batched_writes.py, test_shards.py and
test_objects.py green, the benchmark run again), move the pin in pyproject.toml."""

from __future__ import annotations

import collections
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from psycopg import abc, generators, waiting
from psycopg.adapt import Transformer
from psycopg_pool import AsyncConnectionPool, pool_async
from psycopg_pool.base import AttemptWithBackoff

ROOT = Path(__file__).resolve().parents[2]

# What relies on what: the distribution, then per place in shoal/ the private names it uses.
RELIANCE: dict[str, dict[str, list[str]]] = {
    "psycopg": {
        "shoal/metadata/prepared.py (fetch, dumped, loaded_rows, prepared_name, _result, "
        "checked)": [
            "psycopg.generators.execute",
            "psycopg.adapt.Transformer: from_context, dump_sequence, types, formats, "
            "set_pgresult(result, set_loaders=False), load_rows",
            "psycopg.AsyncConnection.wait",
            "psycopg.errors.error_from_result",
        ],
        "shoal/metadata/batched.py (_Batcher._send, _pipeline_results)": [
            "psycopg.generators.send",
            "psycopg.generators.fetch_many",
            "psycopg.AsyncConnection.wait",
            "PGconn.enter_pipeline_mode, pipeline_sync, exit_pipeline_mode",
        ],
        "shoal/metadata/socket_watch.py (SocketWatch.wait)": [
            "psycopg.waiting.Wait and Ready (what a generator waits for, what it is sent)",
            "psycopg.abc.PQGen: generators driven by next() and send(), result in StopIteration",
        ],
    },
    "psycopg-pool": {
        "shoal/metadata/shards.py (LastInFirstOutPool._get_ready_connection)": [
            "AsyncConnectionPool._get_ready_connection(timeout)",
            "AsyncConnectionPool._pool (a deque, oldest first), _nconns_min",
        ],
        "shoal/metadata/shards.py (ShardPool, _SteadyAttempt)": [
            "psycopg_pool.base.AttemptWithBackoff: INITIAL_DELAY, DELAY_BACKOFF",
            "AsyncConnectionPool._add_connection(attempt, growing)",
            "AsyncConnectionPool._connect(timeout)",
            "AsyncConnectionPool._lock, _waiting, and WaitingClient.fail",
            "AsyncConnectionPool.drain, conninfo, kwargs",
        ],
    },
}


def _recheck(distribution: str) -> str:
    places = RELIANCE[distribution]
    return "; ".join(f"{place} uses {', '.join(names)}" for place, names in places.items())


def _pinned(distribution: str) -> str:
    """The exact version pyproject.toml pins `distribution` to (fails if it is not ==)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s,;]+)", requirement)
        if found and found[1].lower() == distribution:
            return found[3]
    pytest.fail(
        f"pyproject.toml must pin {distribution} to one version (==): {_recheck(distribution)}"
    )


@pytest.mark.parametrize("distribution", sorted(RELIANCE))
def test_installed_version_is_the_pinned_one(distribution: str) -> None:
    installed = importlib.metadata.version(distribution)
    pinned = _pinned(distribution)
    assert installed == pinned, (
        f"{distribution} {installed} is installed, but {pinned} is pinned and is the version "
        f"the metadata fast paths were checked against. Re-check: {_recheck(distribution)}. "
        "Then run the metadata integration tests and bench/psycopg_paths_bench.py, and move "
        "the pin in pyproject.toml."
    )


def test_psycopg_binary_matches_psycopg() -> None:
    """The C Transformer that prepared.py calls ships in psycopg-binary, built per release."""
    assert importlib.metadata.version("psycopg-binary") == psycopg.__version__


def _missing(owner: object, names: list[str]) -> list[str]:
    return [f"{getattr(owner, '__name__', owner)}.{n}" for n in names if not hasattr(owner, n)]


def test_psycopg_private_names_exist() -> None:
    missing = _missing(generators, ["execute", "send", "fetch_many"])
    missing += _missing(Transformer, ["from_context", "dump_sequence", "set_pgresult"])
    missing += _missing(Transformer, ["load_rows", "types", "formats"])
    missing += _missing(psycopg.AsyncConnection, ["wait"])
    missing += _missing(waiting, ["Wait", "Ready"])
    missing += _missing(abc, ["PQGen"])
    missing += _missing(psycopg.errors, ["error_from_result"])
    missing += _missing(psycopg.pq.PGconn, ["send_prepare", "send_query_prepared"])
    missing += _missing(
        psycopg.pq.PGconn, ["enter_pipeline_mode", "pipeline_sync", "exit_pipeline_mode"]
    )
    assert not missing, f"gone from psycopg: {missing}. Re-check: {_recheck('psycopg')}"


def test_psycopg_pool_private_names_exist() -> None:
    missing = _missing(AsyncConnectionPool, ["_get_ready_connection", "_add_connection"])
    missing += _missing(AsyncConnectionPool, ["_connect", "drain"])
    missing += _missing(AttemptWithBackoff, ["INITIAL_DELAY", "DELAY_BACKOFF"])
    missing += _missing(pool_async.WaitingClient, ["fail"])
    unopened = AsyncConnectionPool("", open=False)  # connects to nothing
    missing += _missing(unopened, ["_pool", "_nconns_min", "_waiting", "kwargs", "conninfo"])
    if not isinstance(unopened._pool, collections.deque):
        missing.append("AsyncConnectionPool._pool as a deque")
    if "self._lock = " not in inspect.getsource(pool_async):  # set by open()
        missing.append("AsyncConnectionPool._lock")
    signatures = {
        "_get_ready_connection": ["self", "timeout"],
        "_add_connection": ["self", "attempt", "growing"],
        "_connect": ["self", "timeout"],
    }
    for method, parameters in signatures.items():
        found = list(inspect.signature(getattr(AsyncConnectionPool, method)).parameters)
        if found != parameters:
            missing.append(f"AsyncConnectionPool.{method}{tuple(parameters)} (now {found})")
    assert not missing, (
        f"gone or changed in psycopg_pool {psycopg_pool.__version__}: {missing}. "
        f"Re-check: {_recheck('psycopg-pool')}"
    )
