"""Child processes that end with their parent, however the parent ends.

`shoal serve` starts storage nodes, and a node starts its workers. If the parent ends by
os._exit or SIGKILL it never reaches its clean-up, and its children would live on: they keep
their folders and ports and heartbeat, and a restarted parent would start a second set on the
same folders. Linux's PR_SET_PDEATHSIG sends the child a signal when its parent dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

# prctl(2) option: the signal a process gets when the thread that forked it dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """In the child: get `signum` when `parent` dies; exit now if it already has. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signum)


def preexec_die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that arms die_with_parent in the child.

    PR_SET_PDEATHSIG is per forking thread: start such children from the main thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm
