"""A storage node told to use at most part of its disk ([storage] capacity_bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cluster import capped_usage
from shoal.config import ConfigError, load_config
from shoal.storage.server import BlockCount

MiB = 1024 * 1024


def test_a_capped_node_reports_the_cap_and_what_its_blocks_leave_of_it() -> None:
    assert capped_usage(1000 * MiB, 900 * MiB, 300 * MiB, 60 * MiB) == (300 * MiB, 240 * MiB)
    # Never more free space than the disk has, never less than none.
    assert capped_usage(1000 * MiB, 100 * MiB, 300 * MiB, 60 * MiB) == (300 * MiB, 100 * MiB)
    assert capped_usage(1000 * MiB, 900 * MiB, 300 * MiB, 400 * MiB) == (300 * MiB, 0)
    # A cap above the disk's size is the disk's size.
    assert capped_usage(200 * MiB, 150 * MiB, 300 * MiB, 10 * MiB) == (200 * MiB, 150 * MiB)


def test_the_block_count_keeps_the_bytes_of_every_process() -> None:
    count = BlockCount(3, processes=2, stored_bytes=300)
    count.add(1, 100)
    count.slot = 1  # as a worker process
    count.add(2, 250)
    count.add(-1, -50)
    assert (count.value, count.stored_bytes) == (5, 600)


def test_capacity_bytes_must_be_a_positive_number(tmp_path: Path) -> None:
    config_file = tmp_path / "shoal.toml"
    config_file.write_text("[storage]\ncapacity_bytes = 335544320\n")
    assert load_config(config_file, None).storage.capacity_bytes == 320 * MiB
    config_file.write_text("[storage]\n")
    assert load_config(config_file, None).storage.capacity_bytes is None
    config_file.write_text("[storage]\ncapacity_bytes = 0\n")
    with pytest.raises(ConfigError, match="capacity_bytes"):
        load_config(config_file, None)
