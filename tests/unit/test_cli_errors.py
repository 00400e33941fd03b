"""The CLI's last guard: an error nobody foresaw is still one line, its trace on demand; and
the one line of a failed Spark job."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal import cli
from shoal.config import Config
from shoal.pipeline import failure_line
from shoal.pipeline.session import java_version


@pytest.fixture
def external_config(tmp_path: Path) -> Iterator[Path]:
    """A configuration naming an external shard (nothing is checked for it up front); main()
    sets the umask, which is put back afterwards."""
    config = tmp_path / "shoal.toml"
    config.write_text('[[metadata.shards]]\nname = "s0"\ndsn = "postgresql://x@127.0.0.1:1/x"\n')
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        yield config
    finally:
        os.umask(umask)


def broken(config: Config, args: argparse.Namespace) -> int:
    raise LookupError("the pool ran dry\nand a second line")


def test_an_unexpected_error_is_one_line_naming_it(
    external_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_db_dsn", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["db", "dsn", "--config", str(external_config)]) == 1
    assert capsys.readouterr().err == (
        "shoal: error: LookupError: the pool ran dry (run again with SHOAL_DEBUG=1 for the trace)\n"
    )


def test_with_shoal_debug_the_trace_is_shown(
    external_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "_db_dsn", broken)
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(LookupError):
        cli.main(["db", "dsn", "--config", str(external_config)])


@pytest.mark.parametrize("group", [[], ["account"], ["account", "key"], ["node"], ["ring"]])
def test_a_group_without_its_command_names_the_group_s_usage(
    group: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(group)
    assert exited.value.code == 2
    said = capsys.readouterr().err.splitlines()
    usage, error = said[0], said[-1]
    name = " ".join(["shoal", *group])
    assert usage.startswith(f"usage: {name} [-h]")
    assert error == f"{name}: error: the following arguments are required: command"


def test_a_worker_traceback_gives_its_own_last_line() -> None:
    spark_text = (
        "An error occurred while calling o81.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/io.py", line 3, in connect\n'
        "    return psycopg.connect(dsn)\n"
        "psycopg.OperationalError: connection failed: refused\n"
        "\tIs the server running?\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/x/io.py", line 5, in connect\n'
        "shoal.metadata.errors.MetadataUnavailable: shard s0 is unreachable: refused\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)\n"
    )
    assert failure_line(RuntimeError(spark_text)) == "shard s0 is unreachable: refused"
    assert failure_line(RuntimeError(spark_text.split("\n\nDuring")[0])) == (
        "OperationalError: connection failed: refused"
    )
    assert failure_line(ValueError("plain\nsecond")) == "plain"
    assert failure_line(ValueError()) == "ValueError"


def test_java_versions_as_java_prints_them() -> None:
    assert java_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_version('openjdk version "21" 2023-09-19') == 21
    assert java_version('java version "1.8.0_392"') == 8
    assert java_version("bash: java: command not found") is None


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`shoal ... | head`: the pipe closes before the command writes; no error line."""
    config = tmp_path / "shoal.toml"
    config.write_text('[[metadata.shards]]\nname = "s0"\ndsn = "postgresql://x@127.0.0.1:1/x"\n')
    command = [sys.executable, "-m", "shoal.cli", "db", "dsn", "--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the interpreter has started: its write meets no reader
    with process.stderr:
        error = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    assert error == b""
