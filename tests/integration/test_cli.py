"""The `shoal` command: serve, db migrate/status/dsn, embedded PostgreSQL, errors as one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from shoal.metadata.embedded import EmbeddedPostgres, EmbeddedPostgresError, postgres_bin_dir
from shoal.workers import listening_socket
from tests.fixtures.postgres import create_databases

SHOAL = str(Path(sys.executable).parent / "shoal")


def shoal(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"shoal {' '.join(args)} failed: {result.stderr}")
    return result


# A relation of a deleted table's time window, or an index of one (shoal.metadata.partitions).
WINDOW_RELATION = re.compile(r"_w\d{8}t\d{4}")


def schema_snapshot(dsn: str) -> list[tuple[object, ...]]:
    """Every relation, function and migration record of a database."""
    with psycopg.connect(dsn) as conn:
        relations = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname LIKE 'manta%%' OR n.nspname = 'shoal' ORDER BY 1, 2"
        ).fetchall()
        migrations = conn.execute(
            "SELECT scope, version, name, applied_at FROM shoal.schema_migrations ORDER BY 1, 2"
        ).fetchall()
        ring = conn.execute("SELECT * FROM shoal.ring_vnode ORDER BY 1, 2").fetchall()
    return relations + migrations + ring


def windows(snapshot: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [row for row in snapshot if WINDOW_RELATION.search(str(row[1]))]


def without_windows(snapshot: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [row for row in snapshot if not WINDOW_RELATION.search(str(row[1]))]


def processes_matching(verb: str, data: str) -> list[str]:
    """Command lines of running processes that are `shoal <verb>` on this data directory."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(args).decode(errors="replace")
        if verb in text and data in text:
            found.append(text)
    return found


def modes_up_to_root(path: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in [path, *path.parents]}


def test_migrate_twice_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shoal("db", "migrate", "--data-dir", str(data))
    server = EmbeddedPostgres(data / "postgres")
    with server.running():
        before = schema_snapshot(server.dsn("shard0"))
        out = shoal("db", "migrate", "--data-dir", str(data)).stdout
        assert "ring version 1, 64 vnodes" in out
        after = schema_snapshot(server.dsn("shard0"))
    # Time windows are created ahead of the clock: one more may have come due between the
    # two runs (a window boundary passed), and none may go.
    assert without_windows(after) == without_windows(before)
    assert set(windows(after)) >= set(windows(before)) and windows(before)
    assert not server.is_running()


def test_embedded_postgres_started_on_a_port_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port of the last start looked free, and another process bound it before
    PostgreSQL did: the start goes on with a port of its own, noted for the next start."""
    server = EmbeddedPostgres(tmp_path / "postgres")
    with listening_socket("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        server.initialize()
        (server.root / "port").write_text(f"{port}\n")
        # The check saw the port free: the other process bound it just after.
        monkeypatch.setattr("shoal.metadata.embedded.port_is_free", lambda _: True)
        with server.running():
            assert server.port != port
            with psycopg.connect(server.dsn("postgres"), connect_timeout=10) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_deep_data_dir_s_socket_folder_is_unguessable_and_shoal_s_alone(tmp_path: Path) -> None:
    """A data directory too deep for a Unix socket's path puts the socket in a folder of the
    temporary directory: of a name nobody can make beforehand, this user's alone, and
    refused when it stops being so."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    server = EmbeddedPostgres(deep / "postgres")
    server.initialize()
    with server.running():
        folder = server.socket_dir
        assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("shoal-pg-")
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700
        assert folder.lstat().st_uid == os.geteuid()
        with psycopg.connect(server.dsn("postgres"), connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        folder.chmod(0o777)  # another user could now put a socket of theirs there
        with pytest.raises(EmbeddedPostgresError, match="not this user's alone"):
            server.dsn("postgres")
        folder.chmod(0o700)
    with server.running():  # the next start uses the noted folder again
        assert server.socket_dir == folder
    shutil.rmtree(folder)
    with server.running():  # and one where it went away makes another
        assert server.socket_dir != folder
        assert server.socket_dir.name.startswith("shoal-pg-")


def test_embedded_postgres_loosens_no_permission_outside_the_data_dir(tmp_path: Path) -> None:
    private = tmp_path / "private" / "deeper"
    private.mkdir(parents=True)
    for folder in (private, private.parent):
        folder.chmod(0o700)
    before = modes_up_to_root(private)
    passwd_before = Path("/etc/passwd").read_text()

    shoal("db", "migrate", "--data-dir", str(private / "data"))

    assert modes_up_to_root(private) == before
    assert Path("/etc/passwd").read_text() == passwd_before  # no system user was created
    pgdata = private / "data" / "postgres" / "data"
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700
    assert pgdata.stat().st_uid == os.geteuid()
    assert stat.S_IMODE((private / "data" / "postgres" / "password").stat().st_mode) == 0o600


def test_serve_runs_until_ctrl_c_and_db_commands_work_beside_it(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with subprocess.Popen(
        [SHOAL, "serve", "--data-dir", data],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as serve:
        try:
            check_serving(serve, data)
        finally:
            if serve.poll() is None:
                serve.kill()


def wait_for_nodes(data: str, count: int) -> str:
    """`shoal db status` once `count` storage nodes heartbeat."""
    deadline = time.monotonic() + 60
    while True:
        status = shoal("db", "status", "--data-dir", data).stdout
        if f"storage nodes: {count} alive" in status or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def check_serving(serve: subprocess.Popen[str], data: str) -> None:
    assert serve.stdout is not None
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = serve.stdout.readline()
        lines.append(line)
        if "Press Ctrl-C" in line or not line:
            break
    assert any("Press Ctrl-C" in line for line in lines), lines
    check_secrets_out_of_sight("".join(lines), Path(data))

    dsn = shoal("db", "dsn", "--data-dir", data).stdout.splitlines()[0]
    psql = subprocess.run(
        [
            "bash",
            "-c",
            f'"{postgres_bin_dir()}/psql" "$({SHOAL} db dsn --data-dir {data} '
            '| head -1)" -Atc "SELECT count(*) FROM shoal.ring_vnode"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert psql.stdout.strip() == "64", psql.stderr
    status = wait_for_nodes(data, 2)
    assert "64 vnodes" in status and "manta_bucket_object" in status
    assert "local:node0" in status and "local:node1" in status
    for node in ("node0", "node1"):
        assert (Path(data) / "nodes" / node / "blocks").is_dir()
    second = shoal("serve", "--data-dir", data, check=False)
    assert second.returncode == 1 and "another `shoal serve`" in second.stderr

    serve.send_signal(signal.SIGINT)
    assert serve.wait(timeout=60) == 0
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=3)
    assert not processes_matching("storage-node", data)


def check_secrets_out_of_sight(banner: str, data: Path) -> None:
    """The first start's banner shows the root secret once and the shard's DSN without its
    password; no process has a secret on its command line (the embedded PostgreSQL's
    included: pg_ctl gets the password from a file)."""
    root = shoal("account", "show-root", "--json", "--data-dir", str(data)).stdout
    root_secret = json.loads(root)["secret_access_key"]
    assert banner.count(root_secret) == 1
    password = (data / "postgres" / "password").read_text().strip()
    assert password not in banner and ":***@/shard0?" in banner
    secrets = {
        "the root secret": root_secret,
        "the shard password": password,
        "the cluster secret": (data / "cluster.secret").read_text().strip(),
        "the credentials key": (data / "credentials.key").read_text().strip(),
    }
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        for name, secret in secrets.items():
            assert secret not in command, f"{name} in the command line of {process.info['pid']}"
    assert any(
        f"-D {data}/postgres/data" in " ".join(p.info["cmdline"] or ())
        for p in psutil.process_iter(["cmdline"])
    ), "the embedded PostgreSQL was looked at"


def test_configuration_file_names_external_shards(tmp_path: Path, admin_dsn: str) -> None:
    shards = create_databases(admin_dsn, 2)
    config = tmp_path / "shoal.toml"
    config.write_text(
        "[metadata]\nvnodes = 6\n"
        + "".join(f'[[metadata.shards]]\nname = "{s.name}"\ndsn = "{s.dsn}"\n' for s in shards)
    )
    shoal("db", "migrate", "--config", str(config))
    status = shoal("db", "status", "--config", str(config)).stdout
    assert "6 vnodes over 2 shard(s)" in status
    assert "shard s0" in status and "shard s1" in status
    assert shoal("db", "dsn", "--config", str(config)).stdout.splitlines() == [
        s.dsn for s in shards
    ]


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        (None, "cannot read"),
        ("[metadata\n", "not valid TOML"),
        ("[metadata]\nvnodes = 0\n", "vnodes must be a positive integer"),
        ("[metadata]\ncolour = 'blue'\n", "unknown setting(s) in [metadata]: colour"),
        ("[s3]\ninline_max_bytes = 1048576\n", "inline_max_bytes must be at most 262144"),
        ('[log]\nformat = "xml"\n', '[log] format must be "text" or "json", not \'xml\''),
        (
            '[[metadata.shards]]\ndsn = "host=db password=top secret"\n',
            "shard0: the dsn is not a connection string libpq reads",
        ),
        (
            '[[metadata.shards]]\ndsn = "postgresql://nobody@127.0.0.1:1/x"\n',
            "cannot connect to shard shard0",
        ),
        (b"\xff\xfe[metadata]\n", "is not UTF-8 text (byte 0)"),
        ("[metadata]\nshards = 5\n", "[metadata] shards is a list of tables"),
    ],
    ids=[
        "missing-file",
        "bad-toml",
        "zero-vnodes",
        "unknown-key",
        "inline-too-large",
        "bad-log-format",
        "unreadable-dsn",
        "unreachable-shard",
        "not-utf8",
        "shards-not-a-list",
    ],
)
def test_bad_input_is_one_readable_line(
    tmp_path: Path, config_text: str | bytes | None, message: str
) -> None:
    config = tmp_path / "shoal.toml"
    if isinstance(config_text, bytes):
        config.write_bytes(config_text)
    elif config_text is not None:
        config.write_text(config_text)
    result = shoal("db", "status", "--config", str(config), check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("shoal: error: ") and message in result.stderr


def test_embedded_server_can_hold_several_shards(tmp_path: Path) -> None:
    config = tmp_path / "shoal.toml"
    config.write_text('data_dir = "data"\n[metadata]\nvnodes = 8\nembedded_shards = 2\n')
    shoal("db", "migrate", "--config", str(config))
    status = shoal("db", "status", "--config", str(config)).stdout
    assert "8 vnodes over 2 shard(s)" in status
    assert "vnodes          0, 2, 4, 6" in status
    assert (tmp_path / "data" / "postgres" / "data" / "PG_VERSION").exists()
    port_file = tmp_path / "data" / "postgres" / "port"
    port = port_file.read_text()
    port_file.write_text("not a port\n")
    damaged = shoal("db", "status", "--config", str(config), check=False)
    assert damaged.returncode == 1 and damaged.stderr.count("\n") == 1, damaged.stderr
    assert "postgres/port holds no port number" in damaged.stderr
    port_file.write_text(port)
    assert "8 vnodes over 2 shard(s)" in shoal("db", "status", "--config", str(config)).stdout
    # A server that cannot start says why, not what the log said last time.
    pgdata = tmp_path / "data" / "postgres" / "data"
    pgdata.chmod(0)
    try:
        refused = shoal("db", "status", "--config", str(config), check=False)
    finally:
        pgdata.chmod(0o700)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "PostgreSQL did not start: " in refused.stderr
    assert "Permission denied" in refused.stderr, refused.stderr
