"""HTTP dates as the gateway writes them (Last-Modified) and reads them back."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime

from shoal import httpdate


def test_format_date_writes_what_email_utils_writes_in_any_zone() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        zone = timezone(timedelta(minutes=rng.randrange(-720, 721, 15)))
        moment = datetime.fromtimestamp(rng.uniform(0, 4e9), tz=zone)
        expected = format_datetime(moment.astimezone(UTC), usegmt=True)
        assert httpdate.format_date(moment) == expected


def test_format_date_reads_back_to_the_second() -> None:
    moment = datetime(2024, 2, 29, 23, 59, 58, 999_999, tzinfo=UTC)
    assert httpdate.format_date(moment) == "Thu, 29 Feb 2024 23:59:58 GMT"
    assert httpdate.parse(httpdate.format_date(moment)) == moment.replace(microsecond=0)
    assert httpdate.format_date(moment.replace(tzinfo=None)) == "Thu, 29 Feb 2024 23:59:58 GMT"
