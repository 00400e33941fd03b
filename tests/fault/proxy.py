"""A TCP proxy on 127.0.0.1 in front of a PostgreSQL server that cuts one connection at a chosen
moment: when the client's bytes first contain a trigger (an object key, which travels in the
Bind message of the statement that writes its row).

- `arm(trigger, forward=True)`: the server gets the triggering bytes (and commits what they
  end with a Sync), its answer is swallowed, and the connection is closed on both sides a
  moment later: a commit whose reply never arrives.
- `arm(trigger, forward=False)`: the triggering bytes never reach the server and the
  connection is closed at once: a write cut before its commit.
- `freeze()` until `thaw()`: connections are accepted and bytes received, but nothing goes
  through either way: a server that hangs (a stopped process, a host that stops answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# How long a connection cut after forwarding waits before it closes: ample for the server to
# run and commit a small batch.
CUT_DELAY_SECONDS = 0.5


@dataclass
class _Trigger:
    needle: bytes
    forward: bool


class CuttingProxy:
    def __init__(self, upstream_dsn: str) -> None:
        params = conninfo_to_dict(upstream_dsn)
        self.upstream_dsn = upstream_dsn
        self._host = str(params.get("host") or "127.0.0.1")
        self._port = int(params.get("port") or 5432)
        self._trigger: _Trigger | None = None
        self.fired = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0

    @property
    def dsn(self) -> str:
        """The upstream DSN, through this proxy."""
        return make_conninfo(self.upstream_dsn, host="127.0.0.1", port=str(self.port))

    def start(self) -> CuttingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._links):
                writer.close()
            # Links still waiting (opened while frozen, or mid-copy) end here, not when the
            # loop is closed under them.
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def freeze(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def arm(self, trigger: bytes, *, forward: bool) -> None:
        self.fired.clear()
        self._trigger = _Trigger(trigger, forward)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._host.startswith("/"):  # a Unix socket directory
            return await asyncio.open_unix_connection(f"{self._host}/.s.PGSQL.{self._port}")
        return await asyncio.open_connection(self._host, self._port)

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        await self._flowing.wait()
        try:
            server_in, server_out = await self._open_upstream()
        except OSError:
            client_out.close()
            return
        self._links.update((client_out, server_out))
        cut = asyncio.Event()

        def close_both() -> None:
            for writer in (client_out, server_out):
                writer.close()
                self._links.discard(writer)

        async def to_server() -> None:
            tail = b""
            while chunk := await client_in.read(65536):
                await self._flowing.wait()
                trigger = self._trigger
                if trigger is not None and trigger.needle in tail + chunk:
                    self._trigger = None
                    cut.set()
                    self.fired.set()
                    if trigger.forward:
                        server_out.write(chunk)
                        await server_out.drain()
                        await asyncio.sleep(CUT_DELAY_SECONDS)
                    close_both()
                    return
                server_out.write(chunk)
                await server_out.drain()
                tail = chunk[-len(trigger.needle) :] if trigger is not None else b""

        async def to_client() -> None:
            while chunk := await server_in.read(65536):
                await self._flowing.wait()
                if cut.is_set():
                    continue  # the answer is lost
                client_out.write(chunk)
                await client_out.drain()

        with contextlib.suppress(OSError, ConnectionError):
            await asyncio.gather(to_server(), to_client())
        close_both()


@contextlib.contextmanager
def cutting_proxy(upstream_dsn: str) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(upstream_dsn).start()
    try:
        yield proxy
    finally:
        proxy.stop()
