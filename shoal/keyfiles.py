"""Secrets kept in files of their own, readable by Shoal's user alone (0600); and folders in
the shared temporary directory that must be Shoal's alone.

Two live so: the cluster secret, with which Shoal's processes sign the requests they send each
other (shoal.storage.auth), and the key that seals the secrets stored in the metadata tier
(shoal.credentials). Every process of a cluster reads the same file; the first one makes it.
This module imports nothing of Shoal, so that the commands which only read a key stay quick
to start.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path


def load_or_create_secret(path: Path) -> bytes:
    """The 256-bit secret kept in `path` as hex (made 0600 on first use)."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text().strip())  # another process made it first
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return bytes.fromhex(value)


def is_private_folder(folder: Path) -> bool:
    """Whether `folder` is a folder (not a link to one) of this user that no other can use."""
    try:
        info = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def fresh_private_folder(wanted: Path) -> Path:
    """An empty folder of this user's alone (0700): `wanted`, emptied or made, unless another
    user's file or folder stands there (in a shared temporary directory anyone may take a
    name first), then a new one beside it of a name nobody can guess."""
    if is_private_folder(wanted):
        shutil.rmtree(wanted)
    try:
        wanted.mkdir(mode=0o700)
    except OSError:  # taken, and not by us
        return Path(tempfile.mkdtemp(prefix=f"{wanted.name}-", dir=wanted.parent))
    return wanted
