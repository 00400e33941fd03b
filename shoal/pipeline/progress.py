"""Progress of a pipeline job, for the person or the log that waits for it.

A job declares its phases (`with ctx.progress.phase("read metadata"):`). A phase counts its
work two ways: what the driver does itself, advanced by the job (`phase.advance(n)`, with a
`total` when it is known), and what executors do, counted from Spark: the tasks of every
Spark job started inside the phase (`sc.statusTracker()`, by job group) and the metadata rows
the partition readers handed Spark (an accumulator, `rows_read`).

Where it goes: every `interval` seconds (5 by default) one line per running phase - the
job, the phase, done/total, the rate and an estimate of the time left - through Shoal's log
(which `shoal` writes on stderr), and when a phase ends one line with its counts and its
seconds. When stderr is a terminal the periodic lines give way to a one-line bar, redrawn
every second, naming the job's phase (Spark's own console bar is off: session.py); the final
lines are still logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, TypeVar

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext

log = logging.getLogger("shoal.pipeline")

INTERVAL = 5.0  # seconds between two lines of a phase
# Sets INTERVAL for a run (the tests' runs, which are shorter than one).
INTERVAL_ENV = "SHOAL_PROGRESS_SECONDS"
BAR_INTERVAL = 1.0  # seconds between two redraws of the bar
BAR_WIDTH = 20
# What a job group id looks like: Spark needs one per phase to tell its jobs apart.
_GROUP_PREFIX = "shoal-phase-"

Clock = Callable[[], float]
T = TypeVar("T")


@dataclass(frozen=True)
class Counts:
    """A phase's counts at one moment: its own (`done` of `total` `unit`), Spark's tasks
    (`tasks` of `task_total`), and metadata rows read."""

    done: int
    total: int | None
    unit: str
    tasks: int
    task_total: int
    rows: int


class Phase:
    """One phase of a job; `advance` counts the driver's own work."""

    def __init__(self, name: str, total: int | None, unit: str, started: float) -> None:
        self.name = name
        self.total = total
        self.unit = unit
        self.started = started
        self.group = f"{_GROUP_PREFIX}{uuid.uuid4().hex}"
        self.rows_at_start = 0
        self.done = 0
        # What executors did of the phase's items, when they count them (Progress.tally).
        self.tally: Accumulator[int] | None = None
        self._lock = threading.Lock()

    def advance(self, count: int = 1) -> None:
        with self._lock:
            self.done += count


class Progress:
    """The phases of one job and their reporter (a thread while the job runs: start/stop).

    `clock` (monotonic seconds), `emit` (where lines go) and `stream` (where the bar goes,
    when it is a terminal) are given by tests; `spark` is the job's SparkContext, None for a
    job without one.
    """

    def __init__(
        self,
        job: str,
        spark: SparkContext | None = None,
        *,
        clock: Clock = time.monotonic,
        emit: Callable[[str], None] | None = None,
        stream: TextIO | None = None,
        interval: float | None = None,
    ) -> None:
        self.job = job
        self.spark = spark
        self.clock = clock
        self.emit = emit or log.info
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty()
        self.interval = interval if interval is not None else _interval()
        self.rows = rows_read(spark) if spark is not None else None
        self._phases: list[Phase] = []
        self._current: Phase | None = None  # the phase `begin` opened
        self._last_line: dict[str, float] = {}
        self._bar_shown = False
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what jobs call ----------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str, total: int | None = None, unit: str = "") -> Iterator[Phase]:
        """A phase of the job: Spark jobs started inside it count as its tasks. It ends with
        its final line when the block ends without an error."""
        phase = self._open(name, total, unit)
        try:
            yield phase
        except BaseException:
            self._close(phase, finished=False)
            raise
        self._close(phase, finished=True)

    def begin(self, name: str, total: int | None = None, unit: str = "") -> Phase:
        """The next phase of a job that goes from one to the next: ends the one `begin`
        opened before (its final line), opens this one. run_job ends the last."""
        if self._current is not None:
            self._close(self._current, finished=True)
        self._current = self._open(name, total, unit)
        return self._current

    def tally(self, phase: Phase) -> Accumulator[int]:
        """An accumulator for the executors that do `phase`'s items to add them to (with
        `counting`): they count in the phase's done as each of their tasks ends."""
        if self.spark is None:
            raise ValueError(f"{self.job} has no Spark context to count with")
        phase.tally = self.spark.accumulator(0)
        return phase.tally

    def finish(self, *, finished: bool = True) -> None:
        """End the phase `begin` opened last (with its final line if the job finished)."""
        if self._current is not None:
            self._close(self._current, finished=finished)
            self._current = None

    def _open(self, name: str, total: int | None, unit: str) -> Phase:
        phase = Phase(name, total, unit, self.clock())
        if self.rows is not None:
            phase.rows_at_start = self.rows.value
        with self._lock:
            self._phases.append(phase)
            self._last_line[phase.group] = phase.started
        if self.spark is not None:
            self.spark.setJobGroup(phase.group, f"{self.job}: {name}")
        return phase

    def _close(self, phase: Phase, *, finished: bool) -> None:
        if self.spark is not None:
            # None clears the property (Spark's own clearJobGroup does so); pyspark's stub
            # types the value as str only.
            self.spark.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        with self._lock:
            counts = self.counts(phase) if finished else None
            self._phases.remove(phase)
            self._clear_bar()
            if counts is not None:
                self.emit(self.final_line(phase, counts, self.clock() - phase.started))

    # -- the reporter ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shoal-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear_bar()

    def _run(self) -> None:
        wait = BAR_INTERVAL if self.terminal else min(self.interval, BAR_INTERVAL)
        while not self._stopped.wait(wait):
            try:
                self.tick()
            except Exception as exc:  # progress is never worth a job: say it once, go quiet
                log.debug("progress stopped: %s", exc)
                return

    def tick(self) -> None:
        """Write what is due: the bar on a terminal, else a line per phase that has had none
        for `interval` seconds."""
        with self._lock:
            now = self.clock()
            if self.terminal:
                if self._phases:
                    phase = self._phases[-1]
                    self._draw_bar(self.bar(phase, self.counts(phase), now - phase.started))
                return
            for phase in self._phases:
                if now - self._last_line[phase.group] >= self.interval:
                    self._last_line[phase.group] = now
                    self.emit(self.line(phase, self.counts(phase), now - phase.started))

    def counts(self, phase: Phase) -> Counts:
        tasks, task_total = self._spark_tasks(phase.group)
        rows = self.rows.value - phase.rows_at_start if self.rows is not None else 0
        done = phase.done + (phase.tally.value if phase.tally is not None else 0)
        return Counts(done, phase.total, phase.unit, tasks, task_total, rows)

    def _spark_tasks(self, group: str) -> tuple[int, int]:
        """Tasks done and tasks in all, over the stages Spark has started for the group."""
        if self.spark is None:
            return 0, 0
        tracker = self.spark.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    # -- words -------------------------------------------------------------------------------

    def line(self, phase: Phase, counts: Counts, elapsed: float) -> str:
        """`meter: read metadata: 12/16 tasks, 180,000 rows, 36,000 rows/s, about 2 s left`"""
        return f"{self.job}: {phase.name}: {_progress(counts, elapsed)}"

    def final_line(self, phase: Phase, counts: Counts, elapsed: float) -> str:
        """`meter: read metadata: done, 16 tasks, 250,000 rows in 7.1 s`"""
        done = ", ".join(_amounts(counts, with_totals=False)) or "nothing to do"
        return f"{self.job}: {phase.name}: done, {done} in {elapsed:.1f} s"

    def bar(self, phase: Phase, counts: Counts, elapsed: float) -> str:
        fraction = _fraction(counts)
        filled = round(BAR_WIDTH * (fraction or 0.0))
        gauge = "#" * filled + "-" * (BAR_WIDTH - filled)
        percent = f" {fraction:4.0%}" if fraction is not None else ""
        text = f"{self.job}: {phase.name} [{gauge}]{percent} {_progress(counts, elapsed)}"
        width = shutil.get_terminal_size((100, 24)).columns - 1
        return text[:width]

    def _draw_bar(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._bar_shown = True

    def _clear_bar(self) -> None:
        if self._bar_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._bar_shown = False


def _interval() -> float:
    value = os.environ.get(INTERVAL_ENV)
    try:
        return max(0.1, float(value)) if value else INTERVAL
    except ValueError:
        return INTERVAL


def _amounts(counts: Counts, *, with_totals: bool) -> list[str]:
    parts = []
    if counts.done or counts.total:
        total = f"/{counts.total:,}" if with_totals and counts.total is not None else ""
        parts.append(f"{counts.done:,}{total} {counts.unit}".rstrip())
    if counts.task_total:
        total = f"/{counts.task_total:,}" if with_totals else ""
        parts.append(f"{counts.tasks:,}{total} tasks")
    if counts.rows:
        parts.append(f"{counts.rows:,} rows")
    return parts


def _fraction(counts: Counts) -> float | None:
    """How much of the phase is done: its own count when it has a total, else Spark's tasks
    (of the stages started so far)."""
    if counts.total:
        return min(1.0, counts.done / counts.total)
    if counts.task_total:
        return counts.tasks / counts.task_total
    return None


def _progress(counts: Counts, elapsed: float) -> str:
    parts = _amounts(counts, with_totals=True) or ["started"]
    if elapsed > 0:
        if counts.rows:
            parts.append(f"{counts.rows / elapsed:,.0f} rows/s")
        elif counts.done:
            parts.append(f"{counts.done / elapsed:,.1f} {counts.unit}/s".replace(" /s", "/s"))
        elif counts.tasks:
            parts.append(f"{counts.tasks / elapsed:,.1f} tasks/s")
    fraction = _fraction(counts)
    if fraction:
        parts.append(f"about {_duration(elapsed * (1 - fraction) / fraction)} left")
    else:
        parts.append(f"{_duration(elapsed)} so far")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, seconds_left = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {seconds_left:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def counting(
    items: Iterable[T], tally: Accumulator[int], size: Callable[[T], int] | None = None
) -> Iterator[T]:
    """`items`, each added to `tally` (by `size(item)`, else 1) as it is taken: on an
    executor, what a task's work consumes is what it has done when the task ends."""
    for item in items:
        tally.add(size(item) if size is not None else 1)
        yield item


# -- metadata rows read by executors ----------------------------------------------------------

_rows_read: dict[int, Accumulator[int]] = {}


def rows_read(spark: SparkContext) -> Accumulator[int]:
    """The SparkContext's count of metadata rows the partition readers handed Spark (added
    to by executors, seen by the driver as each task ends)."""
    key = id(spark)
    if key not in _rows_read:
        _rows_read[key] = spark.accumulator(0)
    return _rows_read[key]
