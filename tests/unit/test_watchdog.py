"""The test session's guard: a stuck test ends the session with its stack, and a failure is said
as it happens (tests/fixtures/watchdog.py)."""

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

FAILING_TEST = """
def test_that_fails() -> None:
    assert 1 + 1 == 3, "arithmetic broke"
"""


def _session(folder: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """A pytest session, with the guard, over one test file `name` holding `text`."""
    (folder / name).write_text(text)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.fixtures.watchdog"]
    command += ["-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)]
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=25)


def test_a_stuck_test_ends_the_session_with_its_stack(tmp_path: Path) -> None:
    done = _session(tmp_path, "test_stuck.py", STUCK_TEST)
    assert done.returncode != 0
    assert "Timeout" in done.stderr
    assert "test_stuck_where_no_signal_reaches" in done.stderr


def test_a_failure_is_said_as_it_happens(tmp_path: Path) -> None:
    done = _session(tmp_path, "test_fails.py", FAILING_TEST)
    assert done.returncode == 1
    assert "--- FAILED test_fails.py::test_that_fails (call) ---" in done.stderr
    assert "arithmetic broke" in done.stderr
