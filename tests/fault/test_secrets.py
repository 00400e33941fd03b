"""Secrets kept out of sight by a running Shoal: what `shoal serve` prints and logs, and the
command lines of every process of its tree, on a first start and on a restart on the same
data directory (docs/operations.md, "Secrets")."""

from __future__ import annotations

import stat
from pathlib import Path

import psutil
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.fault.serve_tree import ServeTree
from tests.fixtures.postgres import create_databases

pytestmark = pytest.mark.slow


def command_lines(processes: list[psutil.Process]) -> dict[int, str]:
    lines = {}
    for process in processes:
        try:
            lines[process.pid] = " ".join(process.cmdline())
        except psutil.Error:  # gone meanwhile
            continue
    return lines


def secrets_of(tree: ServeTree, root_secret: str) -> dict[str, str]:
    data = tree.folder / "data"
    return {
        "the root secret": root_secret,
        "the shard password": conninfo_to_dict(tree.shard.dsn)["password"],
        "the cluster secret": (data / "cluster.secret").read_text().strip(),
        "the credentials key": (data / "credentials.key").read_text().strip(),
    }


def new_log_text(log: Path, offset: int) -> str:
    return log.read_text()[offset:]


def test_the_root_secret_is_printed_once_by_the_first_start_and_no_secret_anywhere_else(
    admin_dsn: str, tmp_path: Path
) -> None:
    (shard,) = create_databases(admin_dsn, 1)
    assert conninfo_to_dict(shard.dsn).get("password"), "the test needs a shard with a password"
    tree = ServeTree(tmp_path, shard)
    try:
        first = tree.start()
        client = tree.client()
        client.create_bucket(Bucket="secrets")
        client.put_object(Bucket="secrets", Key="k", Body=b"v")
        secrets = secrets_of(tree, first.root.secret_access_key)
        processes = tree.tree()
        assert len(processes) >= 4, "serve, a gateway worker and two storage nodes"
        for pid, command in command_lines(processes).items():
            for name, secret in secrets.items():
                assert secret not in command, f"{name} in the command line of {pid}: {command}"
        tree.stop()
        output = first.banner + tree.log.read_text()
        assert output.count(first.root.secret_access_key) == 1
        assert f"secret access key  {first.root.secret_access_key}\n" in first.banner
        for name, secret in secrets.items():
            if name != "the root secret":
                assert secret not in output, f"{name} in serve's output"
        assert "***" in first.banner  # the shard's DSN, shown without its password
        # The configuration holds the shard's password, and the test made it 0644.
        assert tree.config.stat().st_mode & stat.S_IROTH
        assert f"{tree.config} holds a secret and other users may read it" in output

        logged_before = len(tree.log.read_text())
        again = tree.start()  # the fixture asks `shoal account show-root` for the secret
        assert again.root == first.root
        assert "show-root --config" in again.banner
        for pid, command in command_lines(tree.tree()).items():
            for name, secret in secrets.items():
                assert secret not in command, f"{name} in the command line of {pid}: {command}"
        tree.stop()
        output = again.banner + new_log_text(tree.log, logged_before)
        for name, secret in secrets.items():
            assert secret not in output, f"{name} in the output of a restart"
    finally:
        tree.stop()
