"""When to start again a child process that died: the one rule for every supervisor in Shoal
(`shoal serve`'s storage nodes, gateway workers, a storage node's workers).

At once after its first exit; then, while it keeps exiting soon after each start, after a
pause that doubles (1 s, 2 s, 4 s, ... up to a minute), so that a process that cannot start
(a bad disk, a port taken, a broken install) does not spin a core restarting and fill the
log. A process that ran steadily for a while before it died starts the count again.
"""

from __future__ import annotations

import time

# A process that exits sooner than this after its start exited "quickly".
STEADY_SECONDS = 30.0
MAX_PAUSE_SECONDS = 60.0


def restart_pause(quick_exits: int) -> float:
    """0 s after the first quick exit in a row, then 1, 2, 4, ... up to the maximum."""
    if quick_exits <= 1:
        return 0.0
    return min(MAX_PAUSE_SECONDS, 2.0 ** (quick_exits - 2))


class Restarts:
    """The restart schedule of one supervised process."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.quick_exits = 0  # exits in a row, each soon after its start
        self.restart_at: float | None = None  # set while it waits to be started again

    def started(self) -> None:
        self.started_at = time.monotonic()
        self.restart_at = None

    def exited(self) -> tuple[float, float]:
        """Note an exit now; (seconds it lived, seconds until it is started again)."""
        now = time.monotonic()
        lived = now - self.started_at
        self.quick_exits = self.quick_exits + 1 if lived < STEADY_SECONDS else 0
        pause = restart_pause(self.quick_exits)
        self.restart_at = now + pause
        return lived, pause

    @property
    def waiting(self) -> bool:
        return self.restart_at is not None

    def due(self) -> bool:
        return self.restart_at is not None and time.monotonic() >= self.restart_at
