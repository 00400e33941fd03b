"""Account names: 1 to 64 letters, digits, '.', '_' or '-', checked whole."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.metadata import MetadataStore
from shoal.metadata.errors import InvalidName
from tests.fixtures.postgres import MakeStore, unique


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    return make_store(shards=1, vnodes=2)


@pytest.mark.parametrize("name", ["alice\n", "", "a b", "-dash", "x" * 65, "é"])
def test_a_name_out_of_the_rules_is_refused(store: MetadataStore, run: Any, name: str) -> None:
    with pytest.raises(InvalidName):
        run(store.accounts.create(name))


def test_a_name_within_them_is_taken(store: MetadataStore, run: Any) -> None:
    name = unique("a.b_c-d")
    assert run(store.accounts.create(name)).name == name
