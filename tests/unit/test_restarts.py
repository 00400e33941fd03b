"""The one restart rule (shoal/restarts.py), and worker processes that follow it and count
their restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from shoal import restarts
from shoal.restarts import Restarts, restart_pause
from shoal.workers import WorkerProcesses


def test_the_pause_is_none_after_a_first_exit_then_doubles_up_to_a_minute() -> None:
    pauses = [restart_pause(n) for n in range(1, 10)]
    assert pauses == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_a_process_that_ran_steadily_before_it_died_is_restarted_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schedule = Restarts()
    assert schedule.exited()[1] == 0.0 and schedule.due()
    schedule.started()
    assert schedule.exited()[1] == 1.0 and not schedule.due()  # a second quick exit
    schedule.started()
    monkeypatch.setattr(restarts, "STEADY_SECONDS", 0.0)  # it ran long enough this time
    assert schedule.exited()[1] == 0.0 and schedule.quick_exits == 0


async def _sleep(worker: int) -> None:
    await asyncio.sleep(60)


def test_worker_processes_restart_a_dead_worker_and_count_it() -> None:
    workers = WorkerProcesses("test", 1, _sleep)
    workers.start()
    try:
        (first,) = workers.processes
        assert first is not None and first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while workers.processes[0] is first:
            assert time.monotonic() < deadline, "the dead worker was not restarted"
            workers.restart_dead()
            time.sleep(0.05)
        assert workers.restarts == 1
        second = workers.processes[0]
        assert second is not None and second.is_alive()
        workers.restart_dead()
        assert workers.restarts == 1  # a live worker is left alone
    finally:
        workers.stop()
