"""Whether a storage node can do its work: take a block onto its disk now.

A disk can turn read-only under a running node (the kernel remounts a file system that has
errors read-only), fill up, or hang. A node's /ready checks by doing what a block write does,
on a tiny file: create it in the node's tmp folder, write, fsync, remove; and asks whether the
blocks folder, where writes are linked and deletes unlink, takes writes. The node's heartbeat
asks the same question, and while the answer is no it offers the registry no free space, so
that gateways place new blocks on other nodes; reads go on meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from typing import Any

from shoal import telemetry
from shoal.storage.blockfile import RESERVED_FREE_BYTES, BlockStore, in_thread

log = logging.getLogger("shoal.storage")

# A probe that has not finished within this finds the disk not writable (a hung disk).
PROBE_SECONDS = 2.0
# Checks closer together than this share one probe (a load balancer may ask every second
# from several places).
REUSE_SECONDS = 1.0
# The probe's file in the node's tmp folder, there only while a probe runs.
PROBE_FILE_PREFIX = "ready-probe-"


class DiskHealth:
    """A node's readiness: its disk takes a write and has room for a block.

    Each probe also sets the process's `shoal_ready` gauge, and a change either way is
    logged.
    """

    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self._last: tuple[bool, dict[str, Any]] | None = None
        self._checked_at = 0.0
        self._lock = asyncio.Lock()

    async def check(self) -> tuple[bool, dict[str, Any]]:
        async with self._lock:
            if self._last is None or time.monotonic() - self._checked_at >= REUSE_SECONDS:
                was_ready = self._last[0] if self._last is not None else True
                self._last = await self._probe()
                self._checked_at = time.monotonic()
                self._report(was_ready, *self._last)
            return self._last

    def _report(self, was_ready: bool, ready: bool, details: dict[str, Any]) -> None:
        telemetry.set_ready(ready)
        if was_ready and not ready:
            log.error(
                "the disk under %s takes no new blocks: %s", self.store.root, details["reason"]
            )
        elif ready and not was_ready:
            log.warning("the disk under %s takes new blocks again", self.store.root)

    async def _probe(self) -> tuple[bool, dict[str, Any]]:
        # direct_writes: whether blocks are written by O_DIRECT, as configured and as the
        # file system allows.
        folder: dict[str, Any] = {
            "blocks_folder": str(self.store.root),
            "direct_writes": self.store.direct_writes,
        }
        try:
            async with asyncio.timeout(PROBE_SECONDS):
                await in_thread(self._write_probe)
                capacity, free = await in_thread(self.store.usage)
        except TimeoutError:
            reason = f"the disk did not take a write within {PROBE_SECONDS} s"
            return False, {"reason": reason, **folder}
        except OSError as exc:
            reason = f"the disk does not take writes: {exc.strerror or exc}"
            return False, {"reason": reason, **folder}
        details: dict[str, Any] = {"capacity_bytes": capacity, "free_bytes": free, **folder}
        if free < RESERVED_FREE_BYTES:
            return False, {"reason": "the disk is full", **details}
        return True, {"reason": "ready", **details}

    def _write_probe(self) -> None:
        path = self.store.tmp / f"{PROBE_FILE_PREFIX}{os.getpid()}"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, b"ready?")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.unlink(path)
        # A write ends with a link into blocks/ and a delete unlinks there: a blocks folder
        # that refuses (mounted read-only apart from tmp/) stops both. Asked of the kernel,
        # not tried: a probe's file among the blocks would be listed by inventories.
        if not os.access(self.store.blocks, os.W_OK):
            folder = self.store.blocks
            raise OSError(errno.EROFS, f"{folder} is read-only, or not this user's to write")
