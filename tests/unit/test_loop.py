"""The garbage collector's settings of a server process after startup (shoal.loop)."""

from __future__ import annotations

import subprocess
import sys

from shoal.loop import YOUNG_COLLECTION_THRESHOLD

# Run apart: freezing the heap of the test process would change every test after this one.
SETTLED = """
import gc
from shoal.loop import settle_heap
before = gc.get_threshold()
settle_heap()
print(gc.get_freeze_count() > 1000, gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:])
"""


def test_settle_heap_freezes_startup_objects_and_collects_less_often() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["True", str(YOUNG_COLLECTION_THRESHOLD), "True"]
