"""The block store on disk: names, verification, never overwriting, ranges, inventory order,
one tmp/ folder per process, direct (O_DIRECT) writes."""

import io
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from shoal.ids import uuid7
from shoal.storage.blockfile import (
    DIRECT_ALIGN,
    DIRECT_PIECE_BYTES,
    HEADER,
    SPARE_FILES,
    WRITE_PIECE_BYTES,
    BlockCorrupt,
    BlockExists,
    BlockNotFound,
    BlockStore,
    ChecksumMismatch,
    InvalidBlockName,
    OutOfSpace,
    block_name,
    check_block_name,
    checksum_of,
    parse_block_name,
)

# A fixed block id, so that the tests' names are the same at every collection (pytest-xdist's
# workers each collect the suite and must agree).
A_BLOCK_ID = "01a2257c-858f-7000-9487-4b8544b06e0a"


class Trickle(io.RawIOBase):
    """A body that arrives `size` bytes at a time, as from a socket."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data = memoryview(data)
        self.size = size

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.size, len(self.data))
        buffer[:count] = self.data[:count]
        self.data = self.data[count:]
        return count


def write(store: BlockStore, name: str, data: bytes, sha: str | None = None) -> bool:
    return store.write(name, io.BytesIO(data), len(data), sha or checksum_of(data))


def read(store: BlockStore, name: str, start: int, end: int) -> bytes:
    """What the node sends of a range, through a socket as a request would get it."""
    ours, theirs = socket.socketpair()

    def send() -> None:
        with theirs, store.open(name, lambda size: (start, end)) as reader:
            reader.send(theirs)

    sender = threading.Thread(target=send)
    sender.start()
    received = bytearray()
    with ours:
        while chunk := ours.recv(1 << 20):
            received += chunk
    sender.join()
    return bytes(received)


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "a\x00b",
        "",
        ".",
        "x.0",
        f"{A_BLOCK_ID}.01",
        A_BLOCK_ID,
        f"{A_BLOCK_ID}.0/..",
        f"{A_BLOCK_ID}.-1",
        f"{A_BLOCK_ID}.0\n",  # `$` would let a final line break through
    ],
)
def test_only_uuid_dot_index_names_are_blocks(name: str) -> None:
    with pytest.raises(InvalidBlockName):
        check_block_name(name)


def test_block_names_round_trip() -> None:
    version = uuid7()
    assert parse_block_name(block_name(version, 12)) == (version, 12)


# Small blocks are checked before they are written, larger ones while they are written.
@pytest.mark.parametrize("data", [b"data", bytes(100 * 1024)], ids=["small", "100KiB"])
def test_write_verifies_size_and_checksum(tmp_path: Path, data: bytes) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 0)
    with pytest.raises(ChecksumMismatch):
        write(store, name, data, sha=checksum_of(b"other"))
    digest = checksum_of(data)
    with pytest.raises(ChecksumMismatch):
        store.write(name, io.BytesIO(data), len(data) + 1, digest)  # the body ends early
    with pytest.raises(ChecksumMismatch):
        store.write(name, io.BytesIO(data), len(data) - 1, digest)
    with pytest.raises(BlockNotFound):
        store.info(name)
    assert list(store.tmp.iterdir()) == []


def test_a_block_is_never_overwritten(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 0)
    assert write(store, name, b"first") is True
    assert write(store, name, b"first") is False  # same content: an idempotent retry
    with pytest.raises(BlockExists):
        write(store, name, b"second")
    assert read(store, name, 0, 5) == b"first"


def test_ranges_and_delete(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 1)
    data = os.urandom(700_000)
    write(store, name, data)
    assert read(store, name, 0, len(data)) == data
    assert read(store, name, 299_999, 600_001) == data[299_999:600_001]
    assert store.info(name).size == len(data)
    assert store.delete(name) is True
    assert store.delete(name) is False


def test_a_batch_removes_what_is_there_and_nothing_when_a_name_is_invalid(
    tmp_path: Path,
) -> None:
    store = BlockStore(tmp_path)
    present = [block_name(uuid7(), i) for i in range(3)]
    for name in present:
        write(store, name, name.encode() * 2)
    files = [store.path_of(name).stat().st_size for name in present]
    gone = block_name(uuid7(), 0)
    with pytest.raises(InvalidBlockName):
        store.remove_many([present[0], "../escape.0"])
    assert all(store.info(name) for name in present)  # nothing removed
    # What each file took (the header and the bytes), None for the block never there.
    sizes = store.remove_many([present[0], gone, *present[1:]])
    assert sizes == [files[0], None, *files[1:]]
    assert store.remove_many(present) == [None, None, None]
    assert store.stored_bytes() == 0


def test_inventory_walks_every_block_once_in_pages(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    names = {block_name(uuid7(), i) for i in range(40)}
    for name in names:
        write(store, name, name.encode())
    seen: list[str] = []
    after = ""
    while True:
        page = store.inventory(after, limit=6)
        seen += [b.name for b in page]
        if len(page) < 6:
            break
        after = page[-1].name
    assert sorted(seen) == sorted(names) and len(seen) == len(set(seen))
    assert store.count() == 40


def test_blocks_larger_than_a_piece_are_written_and_read_in_pieces(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 0)
    data = os.urandom(2 * WRITE_PIECE_BYTES + 12345)
    sha = checksum_of(data)
    assert store.write(name, Trickle(data, 100_000), len(data), sha) is True
    assert read(store, name, 0, len(data)) == data
    across = (WRITE_PIECE_BYTES - 7, 2 * WRITE_PIECE_BYTES + 5)
    assert read(store, name, *across) == data[across[0] : across[1]]
    with pytest.raises(ChecksumMismatch):  # one byte changed in the last piece
        bad = data[:-1] + bytes([data[-1] ^ 1])
        store.write(block_name(uuid7(), 0), Trickle(bad, 65536), len(bad), sha)
    assert list(store.tmp.iterdir()) == []


def test_a_block_shorter_than_its_header_says_is_refused_before_sending(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 0)
    write(store, name, b"data" * 1000)
    path = store.path_of(name)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(BlockCorrupt):
        store.open(name, lambda size: (0, size))


def test_an_empty_block_is_a_file_with_its_header(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    name = block_name(uuid7(), 0)
    assert write(store, name, b"") is True
    assert store.info(name).size == 0
    assert read(store, name, 0, 0) == b""


def test_a_worker_clears_only_its_own_tmp_folder(tmp_path: Path) -> None:
    node = BlockStore(tmp_path)
    worker = BlockStore(tmp_path, worker=1)
    (node.tmp / "being-written").write_bytes(b"x")
    (worker.tmp / "left-by-a-crash").write_bytes(b"x")
    BlockStore(tmp_path, worker=1)  # the worker restarted
    assert [p.name for p in node.tmp.iterdir()] == ["being-written"]
    assert list(worker.tmp.iterdir()) == []
    BlockStore(tmp_path)  # the whole node restarted: nothing of the last run is left
    assert [p for p in (tmp_path / "tmp").rglob("*") if p.is_file()] == []


def test_writes_take_the_files_made_ahead_and_close_removes_the_rest(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    for _ in range(SPARE_FILES + 3):
        store.make_spare()
    spares = set(store.tmp.iterdir())
    assert len(spares) == SPARE_FILES  # no more than that, however many writers ask
    first, second = block_name(uuid7(), 0), block_name(uuid7(), 1)
    assert write(store, first, b"one") is True
    with pytest.raises(ChecksumMismatch):
        write(store, second, b"two", sha=checksum_of(b"other"))
    left = set(store.tmp.iterdir())
    assert left < spares and len(left) == SPARE_FILES - 2  # each write used, then removed, one
    assert read(store, first, 0, 3) == b"one"
    with pytest.raises(BlockNotFound):
        store.info(second)
    store.close()
    assert list(store.tmp.iterdir()) == []
    assert write(store, second, b"two") is True  # with no spare left, a write makes its file


def test_a_block_that_would_fill_the_disk_is_refused(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, reserved_free_bytes=1 << 62)
    name = block_name(uuid7(), 0)
    with pytest.raises(OutOfSpace):
        write(store, name, b"data")
    with pytest.raises(BlockNotFound):
        store.info(name)
    assert list(store.tmp.iterdir()) == []


def test_fan_out_folders_exist_from_the_start_and_come_back_if_removed(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    assert len(list(store.blocks.iterdir())) == 256
    name = block_name(uuid7(), 0)
    store.path_of(name).parent.rmdir()
    assert write(store, name, b"data") is True
    assert read(store, name, 0, 4) == b"data"


def direct_store(path: Path) -> BlockStore:
    """A store that writes by O_DIRECT; the test is skipped where the file system refuses."""
    store = BlockStore(path, direct_writes=True)
    if not store.direct_writes:
        pytest.skip(f"the file system under {path} refuses O_DIRECT")
    return store


@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        DIRECT_ALIGN - HEADER.size,  # header and data fill one aligned write exactly
        DIRECT_ALIGN - HEADER.size + 1,
        DIRECT_PIECE_BYTES - HEADER.size,
        DIRECT_PIECE_BYTES,
        2 * DIRECT_PIECE_BYTES + 12345,
    ],
)
def test_direct_writes_store_blocks_of_any_length(tmp_path: Path, size: int) -> None:
    store = direct_store(tmp_path)
    data = os.urandom(size)
    name = block_name(uuid7(), 0)
    assert store.write(name, Trickle(data, 100_000), size, checksum_of(data)) is True
    # The last write was padded up to DIRECT_ALIGN; the file is cut back to its length.
    assert store.path_of(name).stat().st_size == HEADER.size + size
    assert store.info(name).size == size
    assert read(store, name, 0, size) == data
    start, end = size // 3, size - size // 5
    assert read(store, name, start, end) == data[start:end]
    assert list(store.tmp.iterdir()) == []


def test_direct_writes_refuse_a_block_that_does_not_match(tmp_path: Path) -> None:
    store = direct_store(tmp_path)
    store.make_spare()  # made ahead for O_DIRECT too
    name = block_name(uuid7(), 0)
    data = os.urandom(DIRECT_PIECE_BYTES + 5000)
    sha = checksum_of(data)
    changed = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(ChecksumMismatch):
        store.write(name, Trickle(changed, 65536), len(changed), sha)
    with pytest.raises(ChecksumMismatch, match="bytes, expected"):  # the body ended early
        store.write(name, Trickle(data[:-10], 65536), len(data), sha)
    with pytest.raises(BlockNotFound):
        store.info(name)
    assert list(store.tmp.iterdir()) == []
    assert store.write(name, Trickle(data, 65536), len(data), sha) is True
    assert store.write(name, Trickle(data, 65536), len(data), sha) is False  # the same again
    assert read(store, name, 0, len(data)) == data


def test_a_file_system_that_refuses_o_direct_is_written_through_the_page_cache() -> None:
    """tmpfs refuses O_DIRECT on kernels before 6.6; on later ones this has nothing to show."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        store = BlockStore(Path(folder), direct_writes=True)
        if store.direct_writes:
            pytest.skip("this kernel's tmpfs takes O_DIRECT")
        name = block_name(uuid7(), 0)
        assert write(store, name, b"data") is True
        assert read(store, name, 0, 4) == b"data"
