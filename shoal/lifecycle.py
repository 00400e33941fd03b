"""Bucket lifecycle rules as stored: their bounds, and whether a stored rule can be applied.

The gateway refuses a rule out of these bounds when it is put (shoal/s3/lifecycle.py); the
lifecycle job checks each bucket's stored rules again before it applies any (a rule stored
by an older gateway, or written to the metadata by hand, is not trusted), and skips a bucket
whose rules it cannot apply instead of failing for every bucket.

A stored rule is a dict: id, enabled, prefix, expiration_days, expiration_date (ISO 8601,
midnight UTC), abort_days, and tags (a key -> value map an object's tags must all include;
absent in rules stored before tag filters, meaning none). Optional: noncurrent_expiration
(kept to be answered back), and filter, the shape the rule's prefix and tags were put in, so
that a GET answers them in it (one of FILTER_SHAPES; absent in rules stored before, which
are answered in the shortest shape).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

# Days of Expiration or of AbortIncompleteMultipartUpload: at most about 273 years, so that
# an object's creation time plus the days (rounded up to midnight) stays far inside the
# dates Python and PostgreSQL can hold (year 9999); S3 names no bound of its own.
MAX_DAYS = 100_000
MAX_RULES = 1000
MAX_ID_CHARS = 255
MAX_NEWER_VERSIONS = 100  # S3's bound on a NoncurrentVersionExpiration's NewerNoncurrentVersions
RULE_KEYS = ("id", "enabled", "prefix", "expiration_days", "expiration_date", "abort_days")
OPTIONAL_RULE_KEYS = ("tags", "noncurrent_expiration", "filter")
# Where a rule's prefix and tags were put: the older <Prefix> of the rule, an empty <Filter>,
# or a <Filter> of one <Prefix>, one <Tag>, or <And>.
FILTER_SHAPES = ("Prefix", "Filter", "Filter/Prefix", "Filter/Tag", "Filter/And")


def problem_with(rules: Any) -> str | None:
    """Why a bucket's stored rules cannot be applied, or None if they can."""
    if not isinstance(rules, list) or not 1 <= len(rules) <= MAX_RULES:
        return f"a lifecycle configuration has 1 to {MAX_RULES} rules"
    for index, rule in enumerate(rules):
        problem = _problem_with_rule(rule)
        if problem is not None:
            name = rule.get("id") if isinstance(rule, dict) else None
            return f"rule {name or index + 1}: {problem}"
    return None


def _problem_with_rule(rule: Any) -> str | None:
    if not isinstance(rule, dict) or not set(RULE_KEYS) <= set(rule) <= {
        *RULE_KEYS,
        *OPTIONAL_RULE_KEYS,
    }:
        return f"a rule has the fields {', '.join(RULE_KEYS)}, and may have tags"
    tags = rule.get("tags", {})
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        return "tags is a map of text to text"
    if tags and rule["abort_days"] is not None:
        return "AbortIncompleteMultipartUpload cannot be specified with Tags"
    if "filter" in rule and not _fits_shape(rule["filter"], rule["prefix"], tags):
        shape = rule["filter"]
        return f"filter {shape!r} is no shape of {FILTER_SHAPES} that holds its prefix and tags"
    if not isinstance(rule["id"], str) or len(rule["id"]) > MAX_ID_CHARS:
        return f"the ID is text of at most {MAX_ID_CHARS} characters"
    if not isinstance(rule["enabled"], bool) or not isinstance(rule["prefix"], str):
        return "enabled is true or false and prefix is text"
    for field in ("expiration_days", "abort_days"):
        days = rule[field]
        if days is not None and not _whole(days, MAX_DAYS):
            return f"{field} {days!r} is not a whole number of days from 1 to {MAX_DAYS}"
    date = rule["expiration_date"]
    if date is not None and expiration_date_problem(date) is not None:
        return f"expiration_date {date!r}: {expiration_date_problem(date)}"
    if rule["expiration_days"] is not None and date is not None:
        return "expiration by both days and date"
    noncurrent = rule.get("noncurrent_expiration")
    problem = None if noncurrent is None else _problem_with_noncurrent(noncurrent)
    if problem is not None:
        return f"noncurrent_expiration: {problem}"
    actions = ("expiration_days", "expiration_date", "abort_days")
    if noncurrent is None and all(rule[f] is None for f in actions):
        return "the rule has no action"
    return None


def _problem_with_noncurrent(kept: Any) -> str | None:
    """A rule's NoncurrentVersionExpiration, kept to be answered back (buckets are
    unversioned: it has no version to act on)."""
    if not isinstance(kept, dict) or set(kept) != {"days", "newer_versions"}:
        return "a map of days and newer_versions"
    if not _whole(kept["days"], MAX_DAYS):
        return f"days is a whole number from 1 to {MAX_DAYS}"
    newer = kept["newer_versions"]
    if newer is not None and not _whole(newer, MAX_NEWER_VERSIONS):
        return f"newer_versions is a whole number from 1 to {MAX_NEWER_VERSIONS}, or null"
    return None


def _fits_shape(shape: Any, prefix: Any, tags: dict[str, str]) -> bool:
    """Whether a rule's prefix and tags could have been put in the filter shape it names."""
    if shape in ("Prefix", "Filter/Prefix"):
        return not tags
    if shape == "Filter":
        return not prefix and not tags
    if shape == "Filter/Tag":
        return not prefix and len(tags) == 1
    return shape == "Filter/And"


def _whole(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def expiration_date_problem(text: Any) -> str | None:
    """Why a stored expiration date cannot be used, or None (ISO 8601, midnight UTC)."""
    if not isinstance(text, str):
        return "not a date"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return "not an ISO 8601 date"
    if moment.utcoffset() != timedelta(0):
        return "not in UTC"
    if (moment.hour, moment.minute, moment.second, moment.microsecond) != (0, 0, 0, 0):
        return "not at midnight UTC"
    return None
