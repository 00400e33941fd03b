"""`[pipeline]`: the Spark master and how the driver meets executors on other machines."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.config import ConfigError, PipelineConfig, parse_config
from shoal.pipeline import settings
from shoal.pipeline.settings import chosen_master, is_local, session_settings


@pytest.fixture(autouse=True)
def no_spark_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (settings.MASTER_ENV, settings.DRIVER_HOST_ENV, settings.PARTITIONS_ENV):
        monkeypatch.delenv(name, raising=False)


def pipeline(tmp_path: Path, **raw: object) -> PipelineConfig:
    return parse_config({"pipeline": raw}, base=tmp_path).pipeline


def test_without_a_pipeline_section_jobs_run_locally_on_loopback(tmp_path: Path) -> None:
    config = parse_config({}, base=tmp_path).pipeline
    assert chosen_master(config) == "local[*]"
    chosen = session_settings(config, "local[*]")
    assert chosen["spark.driver.bindAddress"] == "127.0.0.1"
    assert chosen["spark.driver.host"] == "127.0.0.1"
    assert chosen["spark.sql.shuffle.partitions"] == "8"
    assert "spark.driver.port" not in chosen and "spark.executorEnv.PYTHONPATH" not in chosen


def test_a_standalone_master_on_loopback_keeps_the_driver_there_and_hands_over_shoal(
    tmp_path: Path,
) -> None:
    chosen = session_settings(pipeline(tmp_path), "spark://127.0.0.1:7077")
    assert chosen["spark.driver.bindAddress"] == "127.0.0.1"
    assert chosen["spark.driver.host"] == "127.0.0.1"
    # Its executors are started by a worker, not by this driver: they import Shoal from
    # where this driver does, whatever the worker's environment says.
    assert Path(chosen["spark.executorEnv.PYTHONPATH"], "shoal", "pipeline").is_dir()


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local[*]", True),
        ("local[2]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077", True),
        ("spark://[::1]:7077", True),
        ("spark://127.0.0.1:7077,127.0.0.2:7077", True),
        ("spark://spark-master.example:7077", False),
        ("spark://10.0.0.5:7077", False),
        ("spark://127.0.0.1:7077,10.0.0.5:7077", False),
        ("yarn", False),
    ],
)
def test_a_master_is_local_when_its_executors_can_only_be_on_this_machine(
    master: str, local: bool
) -> None:
    assert is_local(master) is local


def test_a_remote_master_binds_every_interface_and_advertises_a_reachable_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "resolvable_host_name", lambda: "driver.example")
    chosen = session_settings(pipeline(tmp_path), "spark://10.0.0.5:7077")
    assert chosen["spark.driver.bindAddress"] == "0.0.0.0"
    assert chosen["spark.driver.host"] == "driver.example"
    # Executors import Shoal from where this driver does.
    assert Path(chosen["spark.executorEnv.PYTHONPATH"], "shoal", "pipeline").is_dir()


def test_a_host_whose_name_resolves_only_to_loopback_lets_spark_choose_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "resolvable_host_name", lambda: None)
    chosen = session_settings(pipeline(tmp_path), "spark://10.0.0.5:7077")
    assert "spark.driver.host" not in chosen
    assert chosen["spark.driver.bindAddress"] == "0.0.0.0"


def test_configured_addresses_ports_and_executors_are_used_as_given(tmp_path: Path) -> None:
    config = pipeline(
        tmp_path,
        master="spark://10.0.0.5:7077",
        driver_host="10.0.0.9",
        driver_bind_address="10.0.0.9",
        driver_port=40000,
        block_manager_port=40100,
        executor_memory="2g",
        executor_cores=2,
        partitions=32,
        spark={"spark.network.crypto.enabled": True, "spark.port.maxRetries": 4},
    )
    chosen = session_settings(config, chosen_master(config))
    assert chosen_master(config) == "spark://10.0.0.5:7077"
    assert chosen["spark.driver.host"] == "10.0.0.9"
    assert chosen["spark.driver.bindAddress"] == "10.0.0.9"
    assert chosen["spark.driver.port"] == "40000"
    assert chosen["spark.blockManager.port"] == "40100"
    assert chosen["spark.executor.memory"] == "2g"
    assert chosen["spark.executor.cores"] == "2"
    assert chosen["spark.sql.shuffle.partitions"] == "32"
    assert chosen["spark.network.crypto.enabled"] == "true"
    assert chosen["spark.port.maxRetries"] == "4"


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pipeline(tmp_path, master="spark://10.0.0.5:7077", driver_host="a.example")
    monkeypatch.setenv(settings.MASTER_ENV, "spark://10.0.0.6:7077")
    monkeypatch.setenv(settings.DRIVER_HOST_ENV, "b.example")
    monkeypatch.setenv(settings.PARTITIONS_ENV, "3")
    assert chosen_master(config) == "spark://10.0.0.6:7077"
    assert chosen_master(config, "local[2]") == "local[2]"
    chosen = session_settings(config, "spark://10.0.0.6:7077")
    assert chosen["spark.driver.host"] == "b.example"
    assert chosen["spark.sql.shuffle.partitions"] == "3"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"master": "spark:/oops"}, "[pipeline] master must be"),
        ({"master": 7077}, "[pipeline] master must be"),
        ({"driver_port": 70000}, "[pipeline] driver_port must be a port number"),
        ({"block_manager_port": -1}, "[pipeline] block_manager_port must be a port number"),
        ({"driver_host": 10}, "[pipeline] driver_host must be a string"),
        ({"executor_memory": "lots"}, "[pipeline] executor_memory must read like"),
        ({"executor_cores": -2}, "executor_cores must be a non-negative integer"),
        ({"partitions": 0}, "[pipeline] partitions must be a positive integer"),
        ({"spark": {"driver.host": "x"}}, "is not a Spark setting"),
        ({"spark": {"spark.x": [1]}}, "must be a string, number or boolean"),
        ({"drivr_port": 1}, "unknown setting(s) in [pipeline]: drivr_port"),
    ],
)
def test_impossible_pipeline_settings_are_refused(
    tmp_path: Path, raw: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        pipeline(tmp_path, **raw)
    assert message in str(refused.value)
