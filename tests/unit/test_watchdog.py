"""The test session's watchdog ends a session whose test is stuck out of pytest-timeout's reach."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STUCK_TEST = """
import signal
import time

import pytest

import tests.fixtures.watchdog

tests.fixtures.watchdog.GRACE_SECONDS = 1.0


@pytest.mark.timeout(1)
def test_stuck_where_no_signal_reaches() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as if inside C code
    time.sleep(30)
"""


def test_a_stuck_test_ends_the_session_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK_TEST)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.fixtures.watchdog",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert done.returncode != 0
    assert "Timeout" in done.stderr
    assert "test_stuck_where_no_signal_reaches" in done.stderr


FAILING_TEST = """
def test_that_fails() -> None:
    assert 1 + 1 == 3, "arithmetic broke"
"""


def test_a_failure_is_said_as_it_happens(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text(FAILING_TEST)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.fixtures.watchdog",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert done.returncode == 1
    said = done.stderr
    assert "--- FAILED test_fails.py::test_that_fails (call) ---" in said
    assert "arithmetic broke" in said
