"""Folders in the shared temporary directory that must be Shoal's alone (shoal.keyfiles): a
name another user took first is never used, whatever stands there."""

from __future__ import annotations

import stat
from pathlib import Path

from shoal.keyfiles import fresh_private_folder, is_private_folder


def test_a_free_name_is_made_this_user_s_alone(tmp_path: Path) -> None:
    wanted = tmp_path / "shoal-metrics"
    assert fresh_private_folder(wanted) == wanted
    assert is_private_folder(wanted) and stat.S_IMODE(wanted.stat().st_mode) == 0o700


def test_a_folder_of_this_user_s_alone_is_emptied_and_used_again(tmp_path: Path) -> None:
    wanted = tmp_path / "shoal-metrics"
    wanted.mkdir(mode=0o700)
    (wanted / "left-by-a-killed-run.db").write_bytes(b"x")
    assert fresh_private_folder(wanted) == wanted
    assert not list(wanted.iterdir())


def test_a_link_or_an_open_folder_in_its_place_is_left_alone(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "keep").write_bytes(b"x")
    link = tmp_path / "linked"
    link.symlink_to(elsewhere)  # someone's trap: a link to a folder to empty
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)  # anyone could put files in it
    for wanted in (link, open_folder):
        assert not is_private_folder(wanted)
        used = fresh_private_folder(wanted)
        assert used != wanted and used.parent == tmp_path and used.name.startswith(wanted.name)
        assert is_private_folder(used)
    assert (elsewhere / "keep").exists()  # nothing was followed or emptied
