"""Wiring: what a Shoal process assembles from its configuration (metadata, nodes, data path).

The storage package knows nothing of PostgreSQL; this module connects the node registry in the
metadata tier to the data path, and runs storage nodes with their heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

import shoal.loop
from shoal import telemetry
from shoal.admin import AdminToken, admin_app, load_or_create_token, serving_admin
from shoal.admin.rates import RequestRates, rates_routes
from shoal.children import preexec_die_with_parent
from shoal.config import Config, ShardConfig
from shoal.credentials import Credentials, KeyPair, load_encryption_key
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import (
    AccessKeyNotFound,
    AccountNotFound,
    InvalidName,
    MetadataError,
    MetadataStore,
)
from shoal.metadata.metrics import sampling_pools
from shoal.metadata.nodes import ACTIVE, DEAD
from shoal.readiness import Readiness, answering_nodes
from shoal.restarts import Restarts
from shoal.storage import (
    BlockClient,
    BlockStore,
    DataPath,
    Node,
    NodeIdentity,
    NodeServer,
)
from shoal.storage.auth import ReplayCache
from shoal.storage.blockfile import in_thread
from shoal.storage.datapath import reuse_block_memory
from shoal.storage.health import DiskHealth
from shoal.storage.metrics import metrics
from shoal.storage.server import BlockCount
from shoal.storage.tls import ServerFiles
from shoal.storage.workers import node_workers
from shoal.workers import WorkerProcesses, inherited_socket, listening_socket, stop_on_signals

log = logging.getLogger("shoal")

# How long a writer trusts its view of the registry before reading it again.
REGISTRY_REFRESH_SECONDS = 2.0
# How often a node marked unreachable is asked whether it answers again (and how long for).
PROBE_SECONDS = 1.0
# Below this free space a node is not offered new blocks (it also refuses them itself).
MIN_FREE_BYTES = 256 * 1024 * 1024
# How often `shoal serve` makes sure the deleted-table windows ahead of now exist.
WINDOW_MAINTENANCE_SECONDS = 600.0
WINDOW_RETRY_SECONDS = 10.0
# How often `shoal serve` looks for a gateway worker or local storage node that died, to
# restart it (when: shoal.restarts).
WORKER_CHECK_SECONDS = 1.0
ROOT_ACCOUNT = "root"
# How long `shoal serve` waits for its local storage nodes' first heartbeat.
NODE_START_SECONDS = 60


class RegistryDirectory:
    """The data path's view of the storage node registry, refreshed every few seconds.

    A node that refused or dropped a connection is marked unreachable at once: it gets no new
    blocks (and reads ask it last) from then on, not only once its heartbeat is older than
    the deadline, which takes up to `heartbeat_deadline` of failed requests. A marked node is
    probed (its /status) about every second in the background and becomes choosable again
    as soon as it answers.

    A node an operator drains or marks dead (its state in the registry) gets no new blocks
    either, from the next refresh on; reads still use a draining node, and ask a dead one
    last, as an unreachable one.
    """

    def __init__(self, store: MetadataStore, deadline: timedelta, client: BlockClient) -> None:
        self.store = store
        self.deadline = deadline
        self.client = client
        self._writable: list[Node] = []
        self._urls: dict[str, str] = {}
        self._read_at = 0.0
        self._unreachable: set[str] = set()
        self._dead: set[str] = set()
        self._probing: asyncio.Task[None] | None = None
        self._probed_at = 0.0

    async def writable_nodes(self) -> list[Node]:
        await self._refresh()
        if not self._reachable(self._writable):
            await self._refresh(force=True)  # a node may have joined since the last read
        return self._reachable(self._writable)

    async def url_of(self, shark: str) -> str | None:
        await self._refresh()
        if shark not in self._urls:
            await self._refresh(force=True)
        self._probe_when_due()
        return self._urls.get(shark)

    async def registered_count(self) -> int:
        await self._refresh()
        return len(self._urls)

    async def registered_urls(self) -> dict[str, str]:
        await self._refresh()
        return dict(self._urls)

    def mark_unreachable(self, shark: str) -> None:
        if shark not in self._unreachable:
            log.warning(
                "storage node %s did not answer; no new blocks go there until it does", shark
            )
            self._unreachable.add(shark)

    def unreachable(self, shark: str) -> bool:
        return shark in self._unreachable or shark in self._dead

    def _reachable(self, nodes: list[Node]) -> list[Node]:
        self._probe_when_due()
        return [n for n in nodes if n.shark not in self._unreachable]

    def _probe_when_due(self) -> None:
        """Start probing the marked nodes, unless a probe runs or ran less than a second ago
        (called by the coroutines above, in the loop the probe runs in)."""
        if not self._unreachable or self._probing is not None:
            return
        if time.monotonic() - self._probed_at < PROBE_SECONDS:
            return
        self._probed_at = time.monotonic()
        self._probing = asyncio.ensure_future(self._probe())

    async def _probe(self) -> None:
        try:
            answered = await asyncio.gather(
                *(self._answers(shark) for shark in list(self._unreachable))
            )
            for shark, answers in answered:
                if answers:
                    log.warning("storage node %s answers again", shark)
                    self._unreachable.discard(shark)
        finally:
            self._probing = None

    async def _answers(self, shark: str) -> tuple[str, bool]:
        url = self._urls.get(shark)
        if url is None:  # gone from the registry: nothing to offer it anyway
            return shark, True
        return shark, await self.client.status_within(url, PROBE_SECONDS, shark) is not None

    async def _refresh(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._read_at < REGISTRY_REFRESH_SECONDS:
            return
        try:
            nodes = await self.store.nodes.list(self.deadline)
            states = await self.store.nodes.states()
        except MetadataError:
            if not self._read_at:
                raise  # no view to go on with
            # The catalog shard is away: the last view serves (a shard holding the objects'
            # rows may still answer), and the next call reads again.
            return
        self._urls = {n.shark: n.url for n in nodes}
        self._dead = {n.shark for n in nodes if states.get(n.name) == DEAD}
        self._writable = [
            Node(name=n.name, datacenter=n.datacenter, url=n.url, free_bytes=n.free_bytes or 0)
            for n in nodes
            if n.alive
            and states.get(n.name, ACTIVE) == ACTIVE
            and (n.free_bytes or 0) >= MIN_FREE_BYTES
        ]
        self._read_at = time.monotonic()


def data_path(config: Config, store: MetadataStore) -> DataPath:
    client = BlockClient(load_or_create_secret(config.secret_file), tls_ca=config.storage.tls_ca)
    return DataPath(
        client,
        RegistryDirectory(store, config.storage.heartbeat_deadline, client),
        block_size=config.storage.block_size,
        replicas=config.storage.replicas or None,
    )


@dataclass(frozen=True)
class NodeSettings:
    root: Path
    host: str
    port: int
    name: str
    datacenter: str
    url: str | None = None  # how others reach it, when not http(s)://host:port
    tls: bool = False  # serves HTTPS ([storage] tls_cert and tls_key)
    admin_port: int | None = None  # its admin listener (health, metrics), on `host`
    # Use at most this much of the disk (None: all of it): the node reports this as its size
    # and what its blocks leave of it as its free space.
    capacity_bytes: int | None = None
    # Listening sockets bound by the process that started this one (`--listen-fd`,
    # `--admin-listen-fd`), used instead of binding `port` and `admin_port` here.
    listen_fd: int | None = None
    admin_listen_fd: int | None = None

    @property
    def public_url(self) -> str:
        return self.url or f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str | None:
        """Where its admin listener answers, as the registry shows it: on `host`, or on the
        public URL's host when it listens on every address."""
        if self.admin_port is None:
            return None
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            host = urlsplit(self.public_url).hostname or host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.admin_port}"


async def run_storage_node(
    config: Config, shards: Sequence[ShardConfig], node: NodeSettings, stop: asyncio.Event
) -> None:
    """Serve a node's blocks and heartbeat to the registry until `stop` is set; with
    `[storage] node_workers` above 1, worker processes serve beside this one."""
    with telemetry.sharing(telemetry.folder_for(node.root, "node")):  # before any worker
        await _serve_node(config, shards, node, stop)


async def _serve_node(
    config: Config, shards: Sequence[ShardConfig], node: NodeSettings, stop: asyncio.Event
) -> None:
    store = BlockStore(node.root, direct_writes=config.storage.direct_writes)
    identity = NodeIdentity(name=node.name, datacenter=node.datacenter)
    secret = load_or_create_secret(config.secret_file)
    # The bytes of the blocks are counted only for a capped node (a scan of every file).
    stored = await in_thread(store.stored_bytes) if node.capacity_bytes else 0
    count = BlockCount(await in_thread(store.count), config.storage.node_workers, stored)
    sock = _listener(node.host, node.port, node.listen_fd)
    extra = config.storage.node_workers - 1
    access: dict[str, Any] = {
        "addresses": [urlsplit(node.public_url).netloc],  # the name clients sign requests for
        # Shared by the node's processes; with workers, they take turns by a lock file.
        "replays": ReplayCache(node.root / "replay.lock" if extra else None),
        "tls": _server_tls(config),
    }
    workers = node_workers(
        extra, node.root, store.direct_writes, secret, identity, count, sock, **access
    )
    server = NodeServer(sock, store, secret, identity, count, **access)
    server.serve_in_thread()
    try:
        workers.start()
        health = DiskHealth(store)
        async with (
            await _open_store(config, shards, pool_max_size=2) as metadata,
            _node_admin(node, health),
        ):
            print(
                f"storage node {identity.shark} serving {node.root} at {node.public_url}",
                flush=True,
            )
            while not stop.is_set():
                workers.restart_dead()
                try:
                    await _heartbeat(metadata, node, health, count)
                except Exception as exc:  # the node keeps serving while the registry is away
                    log.warning("heartbeat failed: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stop.wait(), config.storage.heartbeat_interval.total_seconds()
                    )
    finally:
        await in_thread(workers.stop)
        await in_thread(server.stop)


async def _heartbeat(
    metadata: MetadataStore, node: NodeSettings, health: DiskHealth, count: BlockCount
) -> None:
    """Tell the registry the node lives, with its free space and blocks, and set the disk
    gauges. A disk that takes no writes now offers no free space: gateways choose nodes with
    room for new blocks (MIN_FREE_BYTES), so they write elsewhere until it takes writes
    again, and still read from it."""
    writable, _ = await health.check()
    capacity, free = await in_thread(health.store.usage)
    if node.capacity_bytes is not None:
        capacity, free = capped_usage(capacity, free, node.capacity_bytes, count.stored_bytes)
    blocks = count.value
    node_metrics = metrics()
    node_metrics.disk_used.set(capacity - free)
    node_metrics.disk_free.set(free)
    node_metrics.blocks.set(blocks)
    await metadata.nodes.heartbeat(
        node.name,
        node.datacenter,
        node.public_url,
        capacity,
        free if writable else 0,
        blocks=blocks,
        admin_url=node.admin_url,
    )


def capped_usage(disk_size: int, disk_free: int, cap: int, stored: int) -> tuple[int, int]:
    """(capacity, free) of a node that uses at most `cap` bytes of its disk and whose blocks
    take `stored`: never more free space than the disk has."""
    capacity = min(disk_size, cap)
    return capacity, max(0, min(disk_free, capacity - stored))


def _node_admin(
    node: NodeSettings, health: DiskHealth
) -> contextlib.AbstractAsyncContextManager[None]:
    """A node's admin listener (health and metrics; a node has no admin API)."""
    if node.admin_port is None:
        return contextlib.nullcontext()
    return serving_admin(
        admin_app(health), _listener(node.host, node.admin_port, node.admin_listen_fd)
    )


def _listener(host: str, port: int, inherited_fd: int | None) -> socket.socket:
    """The socket to listen on: the one inherited on `inherited_fd`, which must be bound to
    `port`, or a new one bound to host:port (OSError otherwise, one line from the CLI)."""
    if inherited_fd is None:
        return listening_socket(host, port)
    sock = inherited_socket(inherited_fd)
    bound = sock.getsockname()[1]
    if bound != port:
        sock.close()
        raise OSError(f"file descriptor {inherited_fd} listens on port {bound}, not {port}")
    return sock


def _server_tls(config: Config) -> ServerFiles | None:
    cert, key = config.storage.tls_cert, config.storage.tls_key
    return ServerFiles(cert, key) if cert is not None and key is not None else None


# Where the storage nodes `shoal serve` runs listen: they serve its gateway, on this machine.
LOCAL_NODE_HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeSockets:
    """A storage node's two listening sockets, bound by the process that starts it: the
    node inherits them (`arguments`, `fds`), so no other process can take a port between
    its choice and the node's start."""

    listener: socket.socket
    admin: socket.socket

    @property
    def ports(self) -> tuple[int, int]:
        return self.listener.getsockname()[1], self.admin.getsockname()[1]

    @property
    def fds(self) -> tuple[int, int]:
        return self.listener.fileno(), self.admin.fileno()

    def command(
        self, folder: Path, name: str, datacenter: str, options: Sequence[str] = ()
    ) -> list[str]:
        """The `shoal storage-node` command line of node `name`, on `folder`, serving on these
        sockets (started with `pass_fds=fds`), with further `options` (`--config FILE`)."""
        (port, admin_port), (fd, admin_fd) = self.ports, self.fds
        return [
            sys.executable,
            "-m",
            "shoal.cli",
            "storage-node",
            *("--dir", str(folder)),
            *("--host", self.listener.getsockname()[0]),
            *("--port", str(port), "--listen-fd", str(fd)),
            *("--admin-port", str(admin_port), "--admin-listen-fd", str(admin_fd)),
            *("--name", name),
            *("--datacenter", datacenter),
            *options,
        ]


@contextlib.contextmanager
def node_sockets(host: str, port: int, admin_port: int) -> Iterator[NodeSockets]:
    """Sockets listening on host:port and host:admin_port (0: one the kernel picks), closed
    here when the context ends: by then the node's process holds its own copies."""
    with listening_socket(host, port) as listener, listening_socket(host, admin_port) as admin:
        yield NodeSockets(listener, admin)


@dataclass
class _LocalNode:
    name: str
    port: int  # 0 until its first start, when the kernel picks it
    admin_port: int
    process: subprocess.Popen[bytes] | None = None
    restarts: Restarts = field(default_factory=Restarts)


class LocalNodes:
    """The storage nodes `shoal serve` runs as child processes under <data_dir>/nodes.

    A node that exits (a crash, `kill -9`, the OOM killer) is reaped and started again on its
    folder and port by `restart_dead`, which the serve loop calls every second, when
    shoal.restarts says: at once the first time, then after a pause that doubles while it
    keeps exiting soon after each start.
    """

    def __init__(self, config: Config, config_args: list[str]) -> None:
        self.config = config
        self.config_args = config_args
        self.nodes: list[_LocalNode] = []
        self.restarts = 0  # nodes started again after an exit, since this serve started

    def start(self) -> list[str]:
        """Start the nodes (from the main thread: they die with it, see children.py)."""
        lines = []
        for index in range(self.config.storage.local_nodes):
            node = _LocalNode(name=f"node{index}", port=0, admin_port=0)  # the kernel picks
            self._launch(node)
            self.nodes.append(node)
            scheme = "https" if self.config.storage.tls_cert else "http"
            lines.append(
                f"{self.config.storage.datacenter}:{node.name} {scheme}://127.0.0.1:{node.port}"
                f" (admin http://127.0.0.1:{node.admin_port})"
            )
        return lines

    def restart_dead(self) -> None:
        """Reap any node that exited and start it again, now or after its back-off."""
        for node in self.nodes:
            if not node.restarts.waiting:
                assert node.process is not None
                code = node.process.poll()  # reaps it
                if code is None:
                    continue
                lived, pause = node.restarts.exited()
                log.error(
                    "storage node %s exited with %s after %.0f s; restarting it in %.0f s",
                    node.name,
                    code,
                    lived,
                    pause,
                )
            if node.restarts.due():
                self._launch(node)
                self.restarts += 1

    def stop(self) -> None:
        children = [n.process for n in self.nodes if n.process is not None]
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _launch(self, node: _LocalNode) -> None:
        """Start the node's process on sockets bound here (`node_sockets`): the first time
        on ports the kernel picks, after that on the same ports."""
        with contextlib.ExitStack() as bound:
            try:
                sockets = bound.enter_context(
                    node_sockets(LOCAL_NODE_HOST, node.port, node.admin_port)
                )
            except OSError as exc:
                if node.process is None:
                    raise  # its first start: serve cannot run without it
                log.error(
                    "storage node %s cannot listen on its ports again: %s; trying again later",
                    node.name,
                    exc,
                )
                node.restarts.started()  # restart_dead sees it exited, and waits
                return
            node.port, node.admin_port = sockets.ports
            command = sockets.command(
                self.config.data_dir / "nodes" / node.name,
                node.name,
                self.config.storage.datacenter,
                self.config_args,
            )
            node.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                pass_fds=sockets.fds,
                preexec_fn=preexec_die_with_parent(),
            )
        node.restarts.started()


@dataclass(frozen=True)
class Ready:
    """What a gateway that has become ready tells its starter (the banner's contents)."""

    root: KeyPair
    root_made_now: bool  # this start made the root account (its secret is new)
    port: int  # the S3 port it serves on
    admin_port: int


async def run_gateway(
    config: Config,
    shards: Sequence[ShardConfig],
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[Ready], None] | None = None,
    local_nodes: LocalNodes | None = None,
    admin_port: int | None = None,
    pipeline_args: list[str] | None = None,
) -> None:
    """Serve the S3 API on config.s3.host:port until `stop` is set, with the GC daemon,
    re-replication and the upkeep of deleted-table windows beside it, in this process and
    `s3.workers - 1` more (the gateway keeps no state of its own between requests, so any
    process can serve any request; GC, re-replication and upkeep run here only), and the
    admin listener on config.admin.host:`admin_port` (default config.admin.port). A port 0
    is one the kernel picks (`on_ready` is told which). Worker processes and `local_nodes`
    that die are started again."""
    from shoal.gc import Collector
    from shoal.replication import Rereplicator

    sock = listening_socket(config.s3.host, port)
    admin_sock = listening_socket(
        config.admin.host, config.admin.port if admin_port is None else admin_port
    )
    extra = config.s3.workers - 1
    workers = WorkerProcesses("gateway", extra, _serve_gateway, config, shards, sock)
    async with (
        await _open_store(config, shards, config.metadata.pool_max_size) as store,
        _serving_gateway(config, store, sock) as (credentials, path, readiness),
        _gateway_admin(config, shards, admin_sock, readiness, stop, workers),
    ):
        try:
            root, made_now = await root_keys(credentials)
            workers.start()
            await wait_for_nodes(
                store, path.client, config.storage.local_nodes, config.storage.heartbeat_deadline
            )
            # Its last check may predate the nodes: checked again, a request that follows the
            # banner is served, not answered 503 while a check runs.
            await readiness.refresh()
            if on_ready is not None:
                ports = (sock.getsockname()[1], admin_sock.getsockname()[1])
                on_ready(Ready(root, made_now, *ports))
            collector = Collector(
                store, path, config.gc.leeway, config.gc.batch_size, config.gc.workers
            )
            daemon = None
            if config.gc.enabled:
                daemon = asyncio.create_task(collector.run_forever(config.gc.interval, stop))
            restorer = asyncio.create_task(Rereplicator(store, path).run_forever(stop))
            scheduler = _pipeline_scheduler(config, shards, pipeline_args, stop)
            upkeep_due = 0.0
            while not stop.is_set():
                workers.restart_dead()
                if local_nodes is not None:
                    local_nodes.restart_dead()
                if time.monotonic() >= upkeep_due:
                    wait = await keep_windows(store, config.metadata.partitions_ahead)
                    upkeep_due = time.monotonic() + wait
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), WORKER_CHECK_SECONDS)
            if daemon is not None:
                await daemon
            await restorer
            if scheduler is not None:
                await scheduler
        finally:
            await in_thread(workers.stop)


def _pipeline_scheduler(
    config: Config, shards: Sequence[ShardConfig], args: list[str] | None, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """The task that runs `[pipeline] schedule`'s due jobs, if serve has one to run."""
    from shoal.pipeline.schedule import Scheduler, schedule_rules

    rules = schedule_rules(config)
    if args is None or not any(not rule.off for rule in rules.values()):
        return None
    return asyncio.create_task(Scheduler(config, shards, rules, args).run_forever(stop))


@contextlib.asynccontextmanager
async def _gateway_admin(
    config: Config,
    shards: Sequence[ShardConfig],
    sock: socket.socket,
    readiness: Readiness,
    stop: asyncio.Event,
    workers: WorkerProcesses,
) -> AsyncIterator[None]:
    """The admin listener of `shoal serve`: health, metrics, the admin API and console, with
    the census (GC backlog, last runs) read in the background for the API and metrics."""
    from shoal.admin.api import api_routes
    from shoal.admin.census import Census
    from shoal.admin.collector import CensusCollector
    from shoal.admin.console import console_routes

    token = AdminToken(load_or_create_token(config.admin_token_file))
    census = Census(config, shards, readiness=readiness)
    rates = RequestRates()
    app = admin_app(
        readiness,
        token=token,
        collectors=[CensusCollector(census), RestartCollector(workers)],
        routes=[api_routes(census), rates_routes(rates), console_routes()],
    )
    async with (
        shoal.loop.in_background(census.keep_refreshing(stop)),
        rates.sampling(),
        serving_admin(app, sock),
    ):
        yield


class RestartCollector(Collector):
    """`shoal_gateway_worker_restarts_total`: the gateway workers this serve restarted."""

    def __init__(self, workers: WorkerProcesses) -> None:
        self.workers = workers

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "shoal_gateway_worker_restarts",
            "Gateway worker processes restarted after they died",
            value=self.workers.restarts,
        )


async def keep_windows(store: MetadataStore, ahead: int) -> float:
    """Create the deleted-table windows ahead of now; the seconds until the next upkeep (sooner
    after a failure: `serve` outlives an outage of a shard and tries again)."""
    try:
        await store.ensure_windows(ahead)
    except Exception as exc:
        log.warning("deleted-table window upkeep failed, trying again soon: %r", exc)
        return WINDOW_RETRY_SECONDS
    return WINDOW_MAINTENANCE_SECONDS


@contextlib.asynccontextmanager
async def _serving_gateway(
    config: Config,
    store: MetadataStore,
    sock: socket.socket,
    ready_first: asyncio.Event | None = None,
) -> AsyncIterator[tuple[Credentials, DataPath, Readiness]]:
    """The S3 API served on `sock` by this process while the context lasts.

    With `ready_first` (a worker process's stop event), connections are taken only once
    the process is ready (or stopping): until then the other processes on the socket take
    them, and `serve`'s own answers 503 while it starts. So a worker that starts, or
    restarts, does not answer 503 for its own start to a client that a ready gateway serves.
    """
    from shoal.s3 import http
    from shoal.s3.app import Gateway, make_handler, make_unanswered

    credentials = Credentials(store, load_encryption_key(config.credentials_key_file))
    path = data_path(config, store)
    readiness = Readiness(
        store,
        path.client,
        config.storage.heartbeat_deadline,
        config.storage.replicas or None,
        node_silent=path.node_silent,
    )
    gateway = Gateway(
        store=store, data=path, credentials=credentials, config=config.s3, readiness=readiness
    )
    async with readiness.checking(), sampling_pools(store.shards), telemetry.flushing():
        if ready_first is not None:
            await readiness.serving_or_stopped(ready_first)
        server = await http.serve(
            make_handler(gateway),
            sock,
            head_seconds=config.s3.request_head_seconds,
            unanswered=make_unanswered(gateway),
        )
        shoal.loop.settle_heap()
        reuse_block_memory(config.storage.block_size)
        try:
            yield credentials, path, readiness
        finally:
            await server.close()
            await path.client.close()


async def _open_store(
    config: Config, shards: Sequence[ShardConfig], pool_max_size: int
) -> MetadataStore:
    """A serving process's metadata store. It holds the credentials key: a shard added while
    it runs is opened from the catalog's sealed DSN."""
    return await MetadataStore.open(
        shards, pool_max_size, shard_key=load_encryption_key(config.credentials_key_file)
    )


async def _serve_gateway(
    worker: int, config: Config, shards: Sequence[ShardConfig], sock: socket.socket
) -> None:
    """A gateway worker process: the S3 API on the inherited socket until SIGTERM."""
    stop = stop_on_signals()
    async with (
        await _open_store(config, shards, config.metadata.pool_max_size) as store,
        _serving_gateway(config, store, sock, ready_first=stop),
    ):
        await stop.wait()


async def wait_for_nodes(
    store: MetadataStore, client: BlockClient, count: int, deadline: timedelta
) -> None:
    """Until `count` storage nodes answer at the address they registered (so `serve` says
    ready, and the GC daemon makes its first pass, only when blocks can be reached).

    A fresh heartbeat is not enough after a restart: the registry still holds the previous
    run's nodes, alive by the deadline, at ports nobody listens on any more.
    """
    give_up = time.monotonic() + NODE_START_SECONDS
    while time.monotonic() < give_up:
        alive = [n for n in await store.nodes.list(deadline) if n.alive]
        if len(alive) >= count and len(await answering_nodes(client, alive)) >= count:
            return
        await asyncio.sleep(0.1)
    log.warning("only some storage nodes registered within %d s", NODE_START_SECONDS)


async def root_keys(credentials: Credentials) -> tuple[KeyPair, bool]:
    """The root account's oldest active key, and whether this call made it: on first start,
    or when every key of root's was revoked. Only a key made now has its secret printed
    by `shoal serve`; `shoal account show-root` prints it later."""
    try:
        account = await credentials.store.accounts.get_by_name(ROOT_ACCOUNT)
    except AccountNotFound:
        try:
            return await credentials.create_account(ROOT_ACCOUNT), True
        except InvalidName:  # created meanwhile by another process
            account = await credentials.store.accounts.get_by_name(ROOT_ACCOUNT)
    key = await credentials.oldest_active_key(account)
    if key is not None:
        return key, False
    return await credentials.add_key(account), True


async def root_key(credentials: Credentials) -> KeyPair:
    """The root account's oldest active key, for `shoal account show-root`: nothing made."""
    try:
        account = await credentials.store.accounts.get_by_name(ROOT_ACCOUNT)
    except AccountNotFound:
        raise AccountNotFound("no root account yet: the first `shoal serve` makes it") from None
    key = await credentials.oldest_active_key(account)
    if key is None:
        raise AccessKeyNotFound(
            "every key of the root account is revoked: the next `shoal serve` makes one"
        )
    return key
