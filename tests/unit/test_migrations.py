"""A migration that has landed never changes: a cluster that recorded it never runs it again,
so an edit would reach new clusters only, and leave the others with what it made before
(docs/metadata.md, "Migrations"). A change is a new migration; this holds every landed
migration's text to its digest."""

from __future__ import annotations

import hashlib

import pytest

from shoal.metadata.schema import CATALOG_MIGRATIONS, SHARD_MIGRATIONS, VNODE_MIGRATIONS

LANDED = {
    ("shard", 1): "9630f5e6b2131c4a",
    ("shard", 2): "e544de1a92f2e65f",
    ("shard", 3): "320b2db9da96540a",
    ("catalog", 1): "4d02e91df1598f5f",
    ("catalog", 2): "6efdf794be3d849e",
    ("catalog", 3): "3d39322bac2c3b72",
    ("catalog", 4): "9f2a215fd1041a6e",
    ("catalog", 5): "6b54d9eca9d1b587",
    ("catalog", 6): "af64ab8d7e8d519a",
    ("catalog", 7): "3a4a61fd902eb88c",
    ("catalog", 8): "8e6a45b5d684297e",
    ("catalog", 9): "847aa77b7f5d7091",
    ("catalog", 10): "16cfcb98b25589ce",
    ("catalog", 11): "87ac3bbe37eb15b5",
    ("catalog", 12): "8cf34bc6c843b18f",
    ("vnode", 1): "c3cf5c61380fd6ca",
    ("vnode", 2): "28807369c8475539",
    ("vnode", 3): "e054fdfade990017",
    ("vnode", 4): "cb16626e5f59eff2",
    ("vnode", 5): "e79db99690b9b55d",
    ("vnode", 6): "68ec3dfa60e3dca4",
    ("vnode", 7): "23f608ac7eff219a",
}
MIGRATIONS = {"shard": SHARD_MIGRATIONS, "catalog": CATALOG_MIGRATIONS, "vnode": VNODE_MIGRATIONS}


@pytest.mark.parametrize(("scope", "version"), sorted(LANDED))
def test_a_landed_migration_keeps_its_text(scope: str, version: int) -> None:
    (migration,) = [m for m in MIGRATIONS[scope] if m.version == version]
    digest = hashlib.sha256(migration.ddl.encode()).hexdigest()[:16]
    assert digest == LANDED[scope, version], (
        f"{scope} migration {version} ({migration.name}) changed after it landed: "
        "put the change in a new migration"
    )


def test_every_migration_is_numbered_in_order_and_known_here() -> None:
    """A new migration is added to LANDED with its digest when it lands."""
    for scope, migrations in MIGRATIONS.items():
        versions = [m.version for m in migrations]
        assert versions == list(range(1, len(versions) + 1)), scope
        assert {(scope, v) for v in versions} == {key for key in LANDED if key[0] == scope}
