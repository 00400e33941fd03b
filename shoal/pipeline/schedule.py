"""`[pipeline] schedule`: when `shoal serve` runs each pipeline job (docs/pipeline.md,
"Scheduled runs").

A rule names the moments a job is due, in UTC: "daily 02:00", "weekly sun 05:00",
"hourly :15", "every 6h" (or "every 90m"; counted from midnight UTC), or "off". The rules
below are plain arithmetic on times; `Scheduler` is the part of `serve` that waits and runs.

Whether a job is due is decided from the run history in the catalog, never from memory: a job
is due when no run of it started at or after its latest moment. So a job whose moment passed
while every `serve` was down runs once at the next start, one that ran since does not run
again after a restart, and a job that never ran counts from when the cluster was made (a new
cluster does not start every job at its first start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from shoal.children import preexec_die_with_parent
from shoal.config import Config, ConfigError, ShardConfig
from shoal.metadata import queries
from shoal.metadata.pipeline_runs import PipelineRun, read_last_per_job, read_runs, record_run

log = logging.getLogger("shoal.pipeline")

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAILY = re.compile(r"daily (?P<hour>\d\d):(?P<minute>\d\d)")
_WEEKLY = re.compile(r"weekly (?P<day>[a-z]{3}) (?P<hour>\d\d):(?P<minute>\d\d)")
_HOURLY = re.compile(r"hourly :(?P<minute>\d\d)")
_EVERY = re.compile(r"every (?P<count>\d+)(?P<unit>[hm])")
RULE_FORMS = '"daily HH:MM", "weekly DAY HH:MM", "hourly :MM", "every Nh", "every Nm" or "off"'

# How often the scheduler reads the history again while nothing is due (a run another
# `serve` made, a moment that came): a cheap query on the catalog.
CHECK_SECONDS = 30.0
# How long a job stopped with `serve` gets to end before it is killed.
STOP_SECONDS = 20.0
# One PostgreSQL advisory lock on the catalog for every scheduled run of the cluster: the
# `serve` that holds it runs its job; any other waits for its next check.
SCHEDULER_LOCK = 0x5C_0A_1_5C_4E_D
# Moments are counted from a Monday's midnight UTC: days, weeks and hours all start there.
MONDAY = datetime(2000, 1, 3, tzinfo=UTC)


@dataclass(frozen=True)
class Rule:
    """When a job is due: every `period` from `anchor` (a moment in UTC); never if off."""

    text: str
    period: timedelta | None  # None: off
    anchor: datetime = MONDAY

    @property
    def off(self) -> bool:
        return self.period is None

    def latest(self, now: datetime) -> datetime | None:
        """The last moment at or before `now` the job was due (None when off)."""
        if self.period is None:
            return None
        return now - (now - self.anchor) % self.period

    def next(self, now: datetime) -> datetime | None:
        """The first moment after `now` the job is due (None when off)."""
        latest = self.latest(now)
        return None if latest is None or self.period is None else latest + self.period


def parse_rule(text: object, where: str = "[pipeline] schedule") -> Rule:
    """A rule from its text; a ConfigError of one line naming the forms when it is not one."""
    if not isinstance(text, str):
        raise ConfigError(f"{where} must be one of {RULE_FORMS}, not {text!r}")
    spoken = " ".join(text.lower().split())
    midnight = MONDAY
    if spoken == "off":
        return Rule(text, None)
    if match := _DAILY.fullmatch(spoken):
        return Rule(text, timedelta(days=1), midnight + _time_of_day(match, text, where))
    if match := _WEEKLY.fullmatch(spoken):
        if match["day"] not in WEEKDAYS:
            raise ConfigError(f"{where}: {text!r} names no day; days are {', '.join(WEEKDAYS)}")
        day = timedelta(days=WEEKDAYS.index(match["day"]))
        return Rule(text, timedelta(weeks=1), midnight + day + _time_of_day(match, text, where))
    if match := _HOURLY.fullmatch(spoken):
        minute = int(match["minute"])
        if minute > 59:
            raise ConfigError(f"{where}: {text!r} is no minute of an hour (:00 to :59)")
        return Rule(text, timedelta(hours=1), midnight + timedelta(minutes=minute))
    if match := _EVERY.fullmatch(spoken):
        count = int(match["count"])
        period = timedelta(hours=count) if match["unit"] == "h" else timedelta(minutes=count)
        if count < 1 or period > timedelta(days=1) or timedelta(days=1) % period:
            raise ConfigError(
                f"{where}: {text!r} must divide a day (every 1h, 2h, 3h, 4h, 6h, 8h, 12h, "
                "24h, or minutes that divide 1440)"
            )
        return Rule(text, period, midnight)
    raise ConfigError(f"{where} must be one of {RULE_FORMS}, not {text!r}")


def _time_of_day(match: re.Match[str], text: str, where: str) -> timedelta:
    hour, minute = int(match["hour"]), int(match["minute"])
    if hour > 23 or minute > 59:
        raise ConfigError(f"{where}: {text!r} is no time of day (00:00 to 23:59, UTC)")
    return timedelta(hours=hour, minutes=minute)


def is_due(
    rule: Rule, now: datetime, last_started: datetime | None, cluster_made: datetime
) -> bool:
    """Whether a job is due now: its latest moment came after its last run started (or, for
    a job that never ran, after the cluster was made)."""
    latest = rule.latest(now)
    if latest is None:
        return False
    since = last_started if last_started is not None else cluster_made
    return since < latest


def due_jobs(
    rules: dict[str, Rule],
    now: datetime,
    last_started: dict[str, datetime],
    cluster_made: datetime,
) -> list[str]:
    """The jobs due now, the longest waiting first (then by name)."""
    due = [
        job for job, rule in rules.items() if is_due(rule, now, last_started.get(job), cluster_made)
    ]
    return sorted(due, key=lambda job: (rules[job].latest(now), job))


class Scheduler:
    """Runs the due jobs of `[pipeline] schedule`, one at a time, each as a `shoal pipeline JOB`
    child process (a Spark driver's JVM never lives in the gateway), until `stop` is set.

    The child gets `child_args` (the --config/--data-dir of `serve`), writes its output to
    <data_dir>/pipeline/<job>/scheduled.log, dies with `serve` (children.py) and records its
    run itself, as `shoal pipeline` always does; one that exits without a record (killed,
    out of memory) is recorded here as failed. Each run holds the cluster's scheduler lock
    (an advisory lock on the catalog) from before the last look at the history until its
    record is written, so two `serve`s sharing a catalog never both run a job.
    """

    def __init__(
        self,
        config: Config,
        shards: Sequence[ShardConfig],
        rules: dict[str, Rule],
        child_args: list[str],
    ) -> None:
        self.config = config
        self.dsn = shards[0].dsn  # the catalog, where run_job records runs
        self.rules = {job: rule for job, rule in rules.items() if not rule.off}
        self.child_args = child_args
        self.running: subprocess.Popen[bytes] | None = None

    async def run_forever(self, stop: asyncio.Event) -> None:
        for job, rule in sorted(self.rules.items()):
            log.info("pipeline %s runs on schedule: %s (UTC)", job, rule.text)
        while not stop.is_set():
            try:
                await self.run_due(stop)
            except Exception as exc:  # the catalog is away: try again at the next check
                log.warning("pipeline schedule: could not check for due jobs: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._seconds_to_next_check())

    def _seconds_to_next_check(self) -> float:
        now = datetime.now(UTC)
        moments = [rule.next(now) for rule in self.rules.values()]
        soonest = min((m for m in moments if m is not None), default=None)
        if soonest is None:
            return CHECK_SECONDS
        return max(0.5, min(CHECK_SECONDS, (soonest - now).total_seconds() + 0.5))

    async def run_due(self, stop: asyncio.Event) -> None:
        """Run the jobs due now, one after the other (one look at the history)."""
        async with await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=10
        ) as conn:
            for job in due_jobs(self.rules, *await self._history(conn)):
                if stop.is_set():
                    return
                await self._run_if_still_due(conn, job, stop)

    async def _history(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> tuple[datetime, dict[str, datetime], datetime]:
        """Now, the start of each job's last run, and when the cluster was made."""
        cur = await conn.execute(queries.CLUSTER_MADE)
        row = await cur.fetchone()
        now = datetime.now(UTC)
        made = row[0] if row is not None and row[0] is not None else now
        last = {run.job: run.started for run in await read_last_per_job(conn)}
        return now, last, made

    async def _run_if_still_due(
        self, conn: psycopg.AsyncConnection[Any], job: str, stop: asyncio.Event
    ) -> None:
        cur = await conn.execute(queries.TRY_SCHEDULER_LOCK, {"key": SCHEDULER_LOCK})
        row = await cur.fetchone()
        if row is None or not row[0]:
            log.info("pipeline %s is due; another serve runs a scheduled job now", job)
            return
        try:
            # Another serve may have run it between the first look and the lock.
            now, last, made = await self._history(conn)
            if job in due_jobs(self.rules, now, last, made):
                await self._run(conn, job, stop)
        finally:
            await conn.execute(queries.SCHEDULER_UNLOCK, {"key": SCHEDULER_LOCK})

    async def _run(self, conn: psycopg.AsyncConnection[Any], job: str, stop: asyncio.Event) -> None:
        before = await read_runs(conn, job, limit=1)
        started = datetime.now(UTC)
        log_file = self.config.data_dir / "pipeline" / job / "scheduled.log"
        log.info("pipeline %s is due: running it, its output in %s", job, log_file)
        code = await self._child(job, log_file, stop)
        after = await read_runs(conn, job, limit=1)
        if after and (not before or after[0].id != before[0].id):
            log.info("pipeline %s ended: %s", job, after[0].outcome)
            return
        why = "stopped with shoal serve" if stop.is_set() else f"exited with {code}"
        error = f"the scheduled run {why} before recording its outcome; see {log_file}"
        log.error("pipeline %s: %s", job, error)
        await record_run(conn, PipelineRun(job, started, "failed", error=error))

    async def _child(self, job: str, log_file: Path, stop: asyncio.Event) -> int:
        """Run `shoal pipeline JOB` to its end (or stop it with serve); its exit code."""
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        command = [sys.executable, "-m", "shoal.cli", "pipeline", job, *self.child_args]
        with open(log_file, "ab") as output:
            output.write(f"\n== {datetime.now(UTC).isoformat()} {' '.join(command)}\n".encode())
            output.flush()
            # Started from the loop's thread, the main one: PR_SET_PDEATHSIG follows it.
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec_die_with_parent(),
            )
        self.running = child
        try:
            while child.poll() is None:
                if stop.is_set():
                    await asyncio.to_thread(_end, child)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            self.running = None
            if child.poll() is None:  # cancelled: no child outlives its scheduler
                _end(child)
        return child.returncode


def _end(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def schedule_rules(config: Config) -> dict[str, Rule]:
    """The rules of `[pipeline] schedule` (every job, "off" for those it does not run);
    empty when `[pipeline] scheduled = false`."""
    if not config.pipeline.scheduled:
        return {}
    return {job: parse_rule(text) for job, text in config.pipeline.schedule}
