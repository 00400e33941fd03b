"""`[pipeline] schedule`: its rules, when a job is due, and the one-line errors of a bad one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shoal.config import DEFAULT_SCHEDULE, ConfigError, parse_config
from shoal.pipeline.schedule import due_jobs, is_due, parse_rule, schedule_rules

MADE = datetime(2026, 1, 1, tzinfo=UTC)  # long before any moment below


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_daily_rule_is_due_once_its_time_has_come_and_until_a_run_starts() -> None:
    rule = parse_rule("daily 02:00")
    ran_yesterday = at("2026-03-09 02:00:05")
    assert not is_due(rule, at("2026-03-10 01:59:59"), ran_yesterday, MADE)
    assert is_due(rule, at("2026-03-10 02:00:00"), ran_yesterday, MADE)
    assert not is_due(rule, at("2026-03-10 02:00:30"), at("2026-03-10 02:00:01"), MADE)
    assert not is_due(rule, at("2026-03-10 23:59:00"), at("2026-03-10 02:00:01"), MADE)


def test_a_missed_moment_makes_one_run_however_many_passed() -> None:
    """serve was down for three days: the job is due once, and a run now covers it."""
    rule = parse_rule("daily 02:00")
    now = at("2026-03-12 09:00")
    assert is_due(rule, now, at("2026-03-09 02:00:05"), MADE)
    assert not is_due(rule, now + timedelta(minutes=5), now + timedelta(seconds=1), MADE)


def test_around_midnight() -> None:
    rule = parse_rule("daily 23:50")
    assert rule.latest(at("2026-03-11 00:10")) == at("2026-03-10 23:50")
    assert rule.next(at("2026-03-10 23:55")) == at("2026-03-11 23:50")
    assert is_due(rule, at("2026-03-11 00:10"), at("2026-03-09 23:50:02"), MADE)
    assert not is_due(rule, at("2026-03-11 00:10"), at("2026-03-10 23:51"), MADE)
    just_after = parse_rule("daily 00:00")
    assert just_after.latest(at("2026-03-11 00:00")) == at("2026-03-11 00:00")
    assert just_after.latest(at("2026-03-10 23:59:59")) == at("2026-03-10 00:00")


def test_weekly() -> None:
    rule = parse_rule("weekly sun 05:00")  # 2026-03-15 is a Sunday
    assert rule.latest(at("2026-03-15 05:00")) == at("2026-03-15 05:00")
    assert rule.latest(at("2026-03-15 04:59")) == at("2026-03-08 05:00")
    assert rule.next(at("2026-03-11 12:00")) == at("2026-03-15 05:00")
    assert is_due(rule, at("2026-03-16 00:00"), at("2026-03-08 05:01"), MADE)
    assert not is_due(rule, at("2026-03-14 00:00"), at("2026-03-08 05:01"), MADE)


def test_hourly_and_every() -> None:
    assert parse_rule("hourly :15").latest(at("2026-03-10 10:14")) == at("2026-03-10 09:15")
    every = parse_rule("every 6h")
    assert every.latest(at("2026-03-10 13:00")) == at("2026-03-10 12:00")
    assert every.next(at("2026-03-10 23:00")) == at("2026-03-11 00:00")
    assert parse_rule("every 90m").latest(at("2026-03-10 01:40")) == at("2026-03-10 01:30")


def test_off_is_never_due() -> None:
    rule = parse_rule("off")
    assert rule.off and rule.latest(at("2026-03-10 10:00")) is None
    assert not is_due(rule, at("2026-03-10 10:00"), None, MADE)


def test_a_job_that_never_ran_counts_from_when_the_cluster_was_made() -> None:
    """A new cluster does not start every job at its first start; it waits for the moment."""
    rule = parse_rule("daily 02:00")
    made = at("2026-03-10 09:00")
    assert not is_due(rule, at("2026-03-10 09:01"), None, made)
    assert is_due(rule, at("2026-03-11 02:00"), None, made)


def test_two_due_jobs_come_longest_waiting_first() -> None:
    rules = {"meter": parse_rule("daily 00:30"), "gc": parse_rule("daily 02:00")}
    last = {"meter": at("2026-03-09 00:31"), "gc": at("2026-03-09 02:01")}
    assert due_jobs(rules, at("2026-03-10 03:00"), last, MADE) == ["meter", "gc"]
    assert due_jobs(rules, at("2026-03-10 01:00"), last, MADE) == ["meter"]


def test_the_configuration() -> None:
    default = parse_config({}, base=Path("/srv"))
    assert default.pipeline.scheduled and default.pipeline.schedule == DEFAULT_SCHEDULE
    assert set(schedule_rules(default)) == {"gc", "lifecycle", "meter", "inventory"}
    chosen = parse_config(
        {"pipeline": {"schedule": {"audit": "weekly SUN 05:00", "gc": "off"}}}, base=Path("/")
    )
    rules = schedule_rules(chosen)
    assert set(rules) == {"audit", "gc"} and rules["gc"].off  # a table replaces the default
    assert schedule_rules(parse_config({"pipeline": {"schedule": {}}}, base=Path("/"))) == {}
    off = parse_config({"pipeline": {"scheduled": False}}, base=Path("/"))
    assert schedule_rules(off) == {}


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        ({"gc": "daily 2am"}, '[pipeline] schedule gc must be one of "daily HH:MM"'),
        ({"gc": "daily 24:00"}, "[pipeline] schedule gc: 'daily 24:00' is no time of day"),
        ({"gc": "weekly sunday 05:00"}, "[pipeline] schedule gc must be one of"),
        ({"gc": "weekly sno 05:00"}, "[pipeline] schedule gc: 'weekly sno 05:00' names no day"),
        ({"gc": "hourly :60"}, "is no minute of an hour"),
        ({"gc": "every 7h"}, "[pipeline] schedule gc: 'every 7h' must divide a day"),
        ({"gc": "every 0m"}, "must divide a day"),
        ({"gc": 2}, "[pipeline] schedule gc must be one of"),
        ({"gcc": "off"}, "[pipeline] schedule names no job gcc; jobs are gc,"),
        ("daily", "[pipeline] schedule must be a table"),
    ],
)
def test_bad_schedules_are_one_line_errors(schedule: object, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"pipeline": {"schedule": schedule}}, base=Path("/"))
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_scheduled_must_be_true_or_false() -> None:
    with pytest.raises(ConfigError, match="scheduled must be true or false"):
        parse_config({"pipeline": {"scheduled": "no"}}, base=Path("/"))
