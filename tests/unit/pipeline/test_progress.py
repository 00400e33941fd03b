"""The progress reporter's lines, throttling, final lines and bar, on a clock the test moves."""

from __future__ import annotations

import io

import pytest

from shoal.pipeline.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def reporter(clock: FakeClock, stream: io.StringIO | None = None) -> tuple[Progress, list[str]]:
    lines: list[str] = []
    progress = Progress("meter", clock=clock, emit=lines.append, stream=stream or io.StringIO())
    return progress, lines


def test_a_line_per_phase_with_done_total_rate_and_time_left() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    with progress.phase("write reports", total=100, unit="reports") as phase:
        phase.advance(25)
        clock.now += 5
        progress.tick()
    assert lines[0] == "meter: write reports: 25/100 reports, 5.0 reports/s, about 15 s left"


def test_lines_come_at_most_every_interval() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    phase = progress.begin("read metadata", total=10, unit="vnodes")
    for _ in range(9):  # ticks every second for 9 s: lines at 5 s only
        clock.now += 1
        phase.advance()
        progress.tick()
    assert len(lines) == 1 and lines[0].startswith("meter: read metadata: 5/10 vnodes")
    clock.now += 1
    progress.tick()
    assert len(lines) == 2 and "9/10 vnodes" in lines[1]


def test_each_phase_ends_with_its_counts_and_seconds() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    first = progress.begin("read metadata", total=4, unit="vnodes")
    first.advance(4)
    clock.now += 2.5
    progress.begin("write history")
    clock.now += 61
    progress.finish()
    assert lines == [
        "meter: read metadata: done, 4 vnodes in 2.5 s",
        "meter: write history: done, nothing to do in 61.0 s",
    ]


def test_a_phase_that_failed_has_no_final_line() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    with pytest.raises(RuntimeError), progress.phase("read metadata"):
        raise RuntimeError("shard s0 is unreachable")
    progress.begin("write history")
    progress.finish(finished=False)
    assert lines == []


def test_without_a_total_the_line_says_how_long_so_far() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    with progress.phase("list blocks", unit="blocks") as phase:
        phase.advance(1500)
        clock.now += 3725
        progress.tick()
    assert lines[0] == "meter: list blocks: 1,500 blocks, 0.4 blocks/s, 1 h 02 min so far"


def test_on_a_terminal_a_bar_names_the_phase_instead_of_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # the bar is cut to the terminal's width
    clock = FakeClock()
    screen = Terminal()
    progress, lines = reporter(clock, screen)
    phase = progress.begin("deliver reports", total=4, unit="reports")
    phase.advance(1)
    clock.now += 10
    progress.tick()
    assert lines == []
    bar = screen.getvalue()
    assert bar.startswith("\r\x1b[K") and "meter: deliver reports [#####" in bar
    assert " 25% 1/4 reports" in bar and "about 30 s left" in bar
    progress.finish()
    assert screen.getvalue().endswith("\r\x1b[K")  # the bar is cleared for the final line
    assert lines == ["meter: deliver reports: done, 1 reports in 10.0 s"]


def test_the_bar_is_cut_to_the_terminal_s_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    clock = FakeClock()
    screen = Terminal()
    progress, _ = reporter(clock, screen)
    progress.begin("deliver reports", total=4, unit="reports").advance(1)
    clock.now += 10
    progress.tick()
    drawn = screen.getvalue().removeprefix("\r\x1b[K")
    assert drawn == "meter: deliver reports [#####----------"  # 39 columns: the cursor stays on
