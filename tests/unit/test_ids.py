"""UUIDv7: version bits, time, strict order within a process."""

import time
import uuid

from shoal.ids import uuid7, uuid7_time


def test_uuid7_has_version_7_and_rfc_variant() -> None:
    value = uuid7()
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_tells_its_time() -> None:
    before = time.time()
    value = uuid7()
    assert abs(uuid7_time(value).timestamp() - before) < 1.0


def test_uuid7_is_strictly_increasing_even_within_a_millisecond() -> None:
    values = [uuid7(now_ms=1_700_000_000_000) for _ in range(5000)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
