"""Readiness: whether a gateway process can do its work now.

A gateway is ready when every metadata shard answers and enough storage nodes answer at the
address they registered to take a write: `[storage] replicas` of them, or one when that is
unset (a write then stores as many copies as there are nodes, down to one), and never more
than are registered. `ready` and `reason` say so (what a health check reports).

What the S3 port does with it (`serving`, s3/app.py): it answers every request with 503
ServiceUnavailable until the gateway has been ready once (after a start, its shards and
nodes may not be reachable yet), and whenever too few storage nodes answer to take a write.
`serve` checks again just before it prints its banner (its storage nodes answer), and its
worker processes take connections only once ready (shoal/cluster.py): a client told "ready"
is not answered 503 by a process still starting. A shard that stops answering later costs
only the requests that need it: the check marks it down in its pool, which then refuses its
calls at once (MetadataUnavailable, a 503) until it answers a connect again, while the
buckets of the other shards are served as before. One shard of many must not take every
bucket down with it; and a shard that accepts connections but does not answer (a hung host)
is found here, within a second, where the pool alone would not.

A shard whose commits hang (a synchronous standby that does not answer) still answers the
check: it is found by a commit probe sent with each check (ShardPool.probe_commits), which
refuses the shard's writes while its reads go on, and leaves the gateway ready.

Each storage node that misses a check is told to the data path with the number it missed in
a row (DataPath.node_silent): it gets no new blocks, and after two, the requests waiting on it
are given up, so that a node that hangs holds no request for long.

A request to a ready gateway only reads a flag: the state is checked in the background,
every second, each check bounded in time so that a shard or node that hangs counts as one
that is down. A request to a gateway that is not ready has the state checked again first, so
that a gateway serves as soon as it can rather than up to a second later. That check is
shared by the requests that arrive meanwhile, made at most ten times a second, and waited
for a fifth of a second at most: when shards and nodes answer it takes milliseconds, and a
shard or node that hangs must not hold every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any, Protocol

from shoal import telemetry
from shoal.loop import in_background
from shoal.metadata import MetadataStore
from shoal.metadata.nodes import StorageNode, stretched
from shoal.storage import BlockClient

log = logging.getLogger("shoal")

READY_CHECK_SECONDS = 1.0
# While not ready, a request has the state checked again if the last check is older than
# this, and waits this long at most for that check.
RECHECK_SECONDS = 0.1
CONFIRM_SECONDS = 0.2
# A shard or node that does not answer within this is one that is down, for this check.
ANSWER_SECONDS = 1.0
# A check that takes longer than this finds the gateway not ready.
CHECK_TIMEOUT_SECONDS = 3.0


class NodeSilent(Protocol):
    def __call__(self, shark: str, url: str, *, checks: int) -> None: ...


class Readiness:
    """This process's readiness, kept up to date by `checking()`."""

    def __init__(
        self,
        store: MetadataStore,
        client: BlockClient,
        deadline: timedelta,
        replicas: int | None,
        node_silent: NodeSilent | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.deadline = deadline
        self.replicas = replicas  # None: the default number of copies
        # Told of each alive node that missed a check, with how many it missed in a row
        # (the data path: DataPath.node_silent).
        self.node_silent = node_silent
        self._missed: dict[str, int] = {}
        self.ready = False
        self.reason = "not checked yet"
        self.serving = False  # what the S3 port does: see the module's docstring
        # What the last check saw, for /ready: shards that did not answer, shards whose
        # commits hang, nodes.
        self.silent_shards: list[str] = []
        self.hung_shards: list[str] = []
        self.nodes_answering: int | None = None
        self.nodes_needed: int | None = None
        self._been_ready = False
        self._nodes_ok = False  # as last seen: the registry cannot be read without the catalog
        self._checked_at = 0.0
        self._rechecking: asyncio.Future[None] | None = None

    @contextlib.asynccontextmanager
    async def checking(self) -> AsyncIterator[Readiness]:
        """Check now, then every second in the background while the context lasts."""
        await self.refresh()
        async with in_background(self._keep_checking()):
            yield self

    def heartbeat_deadline(self, deadline: timedelta) -> timedelta:
        """`deadline` as this process reads the nodes' heartbeats: stretched while the
        catalog's commits hang (nodes.stretched)."""
        return stretched(deadline, self.store.shards.catalog.pool)

    async def check(self) -> tuple[bool, dict[str, Any]]:
        """What /ready answers (the admin listener's Health): the last check's result."""
        return self.ready, {
            "reason": self.reason,
            "shards_not_answering": self.silent_shards,
            "shards_not_committing": self.hung_shards,
            "storage_nodes_answering": self.nodes_answering,
            "storage_nodes_needed": self.nodes_needed,
        }

    async def confirm(self) -> bool:
        """Whether to serve S3 requests, checked again first if the last check said no."""
        if self.serving:
            return True
        if self._rechecking is None and time.monotonic() - self._checked_at >= RECHECK_SECONDS:
            self._rechecking = asyncio.ensure_future(self.refresh())
            self._rechecking.add_done_callback(self._rechecked)
        if self._rechecking is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._rechecking), CONFIRM_SECONDS)
        return self.serving

    async def serving_or_stopped(self, stop: asyncio.Event) -> None:
        """Return once this process serves S3 requests (as the checks in the background find
        it), or once `stop` is set."""
        while not self.serving and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RECHECK_SECONDS)

    def _rechecked(self, _: asyncio.Future[None]) -> None:
        self._rechecking = None

    async def refresh(self) -> None:
        """Check now, and keep the result."""
        shards_answer = False
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                shards_answer, reason = await self._check()
        except TimeoutError:
            reason = f"the check took over {CHECK_TIMEOUT_SECONDS:.0f} s"
        except Exception as exc:  # a shard or the registry failed: not ready, say why
            reason = f"the check failed: {exc!r}"
        if reason is None and not self.ready:
            log.info("gateway ready")
        elif reason is not None and self.ready:
            log.warning("gateway not ready: %s", reason)
        self.ready = reason is None
        self.reason = reason or "ready"
        telemetry.set_ready(self.ready)
        self._been_ready = self._been_ready or self.ready
        # Once ready, a silent shard is the pool's business (it refuses that shard's calls).
        self.serving = self.ready or (self._been_ready and not shards_answer and self._nodes_ok)
        self._checked_at = time.monotonic()

    async def _check(self) -> tuple[bool, str | None]:
        """Whether every shard answers, and why this gateway cannot do its work now (None if
        it can). Shards that do not answer are marked down in their pools."""
        silent = await self.store.silent_shards(ANSWER_SECONDS)
        self.silent_shards = sorted(silent)
        self.store.shards.mark_unreachable(silent, f"did not answer within {ANSWER_SECONDS:g} s")
        # Not a reason to stop serving: their reads go on, their writes are refused.
        self.hung_shards = sorted(set(self.store.hung_shards()) - set(silent))
        nodes_short = None
        if self.store.shards.catalog.name not in silent:  # else the registry cannot be read
            nodes_short = await self._nodes_short()
            self._nodes_ok = nodes_short is None
        if silent:
            return False, f"metadata shard(s) {', '.join(silent)} do not answer"
        return True, nodes_short

    async def _nodes_short(self) -> str | None:
        """Why too few storage nodes answer to take a write, or None if enough do."""
        nodes = await self.store.nodes.list(self.deadline)
        needed = max(1, min(self.replicas or 1, len(nodes)))
        alive = [n for n in nodes if n.alive]
        answering = await answering_nodes(self.client, alive)
        self._count_missed(alive, answering)
        self.nodes_answering, self.nodes_needed = len(answering), needed
        if len(answering) < needed:
            return f"{len(answering)} storage node(s) answer, {needed} needed"
        return None

    def _count_missed(self, alive: list[StorageNode], answering: list[StorageNode]) -> None:
        """Count each alive node's checks missed in a row, and tell `node_silent` of those
        that missed this one."""
        answered = {n.shark for n in answering}
        self._missed = {
            n.shark: self._missed.get(n.shark, 0) + 1 for n in alive if n.shark not in answered
        }
        if self.node_silent is not None:
            for node in alive:
                if node.shark in self._missed:
                    self.node_silent(node.shark, node.url, checks=self._missed[node.shark])

    async def _keep_checking(self) -> None:
        while True:
            await asyncio.sleep(READY_CHECK_SECONDS)
            await self.refresh()


async def answering_nodes(client: BlockClient, nodes: Sequence[StorageNode]) -> list[StorageNode]:
    """The nodes that answer at the address they registered, as themselves.

    A fresh heartbeat is not enough after a restart: the registry still holds the previous
    run's nodes, alive by the deadline, at ports nobody (or something else) listens on.
    """
    answering = await client.answering({n.shark: n.url for n in nodes}, ANSWER_SECONDS)
    return [node for node in nodes if node.shark in answering]
