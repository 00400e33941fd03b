"""The CPU floor of a large PUT and GET on this machine: what each MiB costs however well a
server is written, measured here, and the rate those costs allow on this machine's cores.

    .venv/bin/python bench/cpu_floor.py                  # 64 MiB, 2 replicas
    .venv/bin/python bench/cpu_floor.py --mib 256 --replicas 1

The costs, CPU milliseconds per MiB of object (thread CPU time, best of a few runs):
  md5             hashlib's MD5 of the body (the ETag; S3 clients check it)
  block checksum  XXH3-128 of the body, once on the gateway and once on each replica's node
  load generator  making the body as peer_bench's `big` workload does and sending it over a
                  loopback TCP connection (the sender's side)
  node write      writing the body to a new file in 256 KiB pieces and fsyncing it, once per
                  replica (the writer's side: the kernel's writeback threads are not counted)
Their sum over the cores is the ceiling peer_bench prints beside the 64 MiB PUT rates. The
data path moves the body over loopback more than the load generator's send: the gateway
receives it and sends it to each replica, each node receives it; those transfers are measured
too (sender and receiver) and given as a second, lower ceiling, with the one other cost of
Shoal's design: a node creates a file for each block (4 MiB by default) it stores. The
disk's own bound is the write + fsync's wall-clock rate over the replicas.

A GET of a body in the page cache costs, per MiB:
  client receive  the load generator's side: receiving the body over loopback, each piece a
                  new bytes object as an asyncio client gets it, and comparing it with the
                  pattern (peer_bench's read-back)
  sendfile        the server's least: the file sent to the socket from the page cache
Their sum is the GET ceiling of any server. Shoal's data path adds a hop (the node sends the
block to the gateway, which receives it and sends it on) and the gateway's check of the block
checksum: the second GET ceiling.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import xxhash
from s3_bench import Pattern

WRITE_PIECE = 256 * 1024  # as a storage node writes a block (shoal/storage/blockfile.py)
RECEIVE_PIECE = 256 * 1024
REPEATS = 3
BLOCK_MIB = 4  # a storage node's block size by default
CREATES = 200


@dataclass(frozen=True)
class Floor:
    """CPU ms per MiB of each cost, and what they allow."""

    mib: int
    replicas: int
    cores: int
    md5: float
    block_checksum: float  # one pass; the gateway and each replica make one
    load_generator: float  # making the body and sending it
    client_send: float  # the sending part of load_generator
    node_write: float  # one replica's
    transfer: float  # one loopback hop, sender and receiver
    disk_mib_s: float  # wall-clock rate of one write + fsync
    file_create: float  # a block file's creation, per MiB of 4 MiB blocks
    client_receive: float  # a GET's load generator: receive and compare
    sendfile: float  # a GET's least server work: page cache to socket

    @property
    def per_mib(self) -> float:
        """CPU ms per MiB of the costs every server pays: hashes, client, replica writes."""
        checksums = self.block_checksum * (1 + self.replicas)
        return self.md5 + checksums + self.load_generator + self.node_write * self.replicas

    @property
    def transfers(self) -> float:
        """The data path's loopback hops beyond the client's send: the gateway receiving the
        body (counted as a hop less the send the load generator already paid) and one hop to
        each replica."""
        return self.transfer * self.replicas + max(0.0, self.transfer - self.client_send)

    @property
    def ceiling(self) -> float:
        """MiB/s the floor allows on all cores."""
        return self.cores * 1000 / self.per_mib

    @property
    def shoal_path(self) -> float:
        """What Shoal's data path adds per MiB: the transfers, a block file on each replica."""
        return self.transfers + self.file_create * self.replicas

    @property
    def ceiling_with_transfers(self) -> float:
        return self.cores * 1000 / (self.per_mib + self.shoal_path)

    @property
    def disk_ceiling(self) -> float:
        """MiB/s of objects the disk allows when every byte is written `replicas` times."""
        return self.disk_mib_s / self.replicas

    @property
    def get_per_mib(self) -> float:
        """CPU ms per MiB every server's GET pays: the client's receive, a sendfile."""
        return self.client_receive + self.sendfile

    @property
    def get_per_mib_with_hop(self) -> float:
        """Shoal's GET adds the node-to-gateway hop and the gateway's checksum check."""
        return self.get_per_mib + self.transfer + self.block_checksum

    @property
    def get_ceiling(self) -> float:
        return self.cores * 1000 / self.get_per_mib

    @property
    def get_ceiling_with_hop(self) -> float:
        return self.cores * 1000 / self.get_per_mib_with_hop

    def describe(self) -> str:
        return self.describe_put() + "\n" + self.describe_get()

    def describe_get(self) -> str:
        return (
            f"CPU floor of a {self.mib} MiB GET from the page cache, ms/MiB: client receive "
            f"{self.client_receive:.2f} + sendfile {self.sendfile:.2f} = "
            f"{self.get_per_mib:.2f}: ceiling {self.get_ceiling:,.0f} MiB/s on {self.cores} "
            f"cores. With the gateway's hop and checksum ({self.transfer:.2f} + "
            f"{self.block_checksum:.3f}) {self.get_per_mib_with_hop:.2f}: "
            f"{self.get_ceiling_with_hop:,.0f} MiB/s."
        )

    def describe_put(self) -> str:
        return (
            f"CPU floor of a {self.mib} MiB PUT with {self.replicas} replica(s), ms/MiB: "
            f"MD5 {self.md5:.2f} + block checksums {1 + self.replicas} x "
            f"{self.block_checksum:.3f} + load generator {self.load_generator:.2f} + node "
            f"writes {self.replicas} x {self.node_write:.2f} = {self.per_mib:.2f}: ceiling "
            f"{self.ceiling:,.0f} MiB/s on {self.cores} cores. With the loopback transfers "
            f"the data path makes (gateway receive, {self.replicas} x send + node receive; "
            f"{self.transfer:.2f} a hop) and a file created per {BLOCK_MIB} MiB block on each "
            f"replica ({self.file_create * BLOCK_MIB:.3f} ms a file, {self.file_create:.3f} a "
            f"MiB) {self.per_mib + self.shoal_path:.2f}: "
            f"{self.ceiling_with_transfers:,.0f} MiB/s. Disk: write + fsync at "
            f"{self.disk_mib_s:,.0f} MiB/s over {self.replicas} replica(s) = "
            f"{self.disk_ceiling:,.0f} MiB/s."
        )


def typical(floors: Sequence[Floor]) -> Floor:
    """The median of each figure over several measurements (one a round)."""
    first = floors[0]

    def middle(name: str) -> float:
        values = sorted(getattr(f, name) for f in floors)
        return values[len(values) // 2]

    return replace(first, **{name: middle(name) for name in MEASURED})


def thread_cpu_ms(work: Callable[[], object]) -> float:
    started = time.thread_time()
    work()
    return (time.thread_time() - started) * 1000


def best(work: Callable[[], object], repeats: int = REPEATS) -> float:
    return min(thread_cpu_ms(work) for _ in range(repeats))


def node_write(directory: Path, body: bytes) -> tuple[float, float]:
    """(CPU ms, wall s) of writing `body` to a new file in pieces and fsyncing it."""
    path = directory / f"floor-{os.getpid()}-{threading.get_ident()}.bin"
    view = memoryview(body)
    started_cpu, started = time.thread_time(), time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for offset in range(0, len(body), WRITE_PIECE):
            piece = view[offset : offset + WRITE_PIECE]
            while piece:
                piece = piece[os.write(fd, piece) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    cpu, wall = (time.thread_time() - started_cpu) * 1000, time.perf_counter() - started
    path.unlink()
    return cpu, wall


def loopback_transfer(
    parts: Sequence[bytes], compare: Callable[[int, bytes], None] | None = None
) -> tuple[float, float]:
    """(sender CPU ms, receiver CPU ms) of sending `parts` over a loopback TCP connection,
    the receiver reading into one reused buffer; or, given `compare`, receiving each piece
    as a new bytes object (as an asyncio client does) and passing it and its offset to
    `compare`."""
    total = sum(len(p) for p in parts)
    received_cpu: list[float] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def receive() -> None:
            connection, _ = server.accept()
            with connection:
                buffer = memoryview(bytearray(RECEIVE_PIECE))
                started, got = time.thread_time(), 0
                while got < total:
                    if compare is None:
                        count = connection.recv_into(buffer)
                    else:
                        piece = connection.recv(RECEIVE_PIECE)
                        compare(got, piece)
                        count = len(piece)
                    if not count:
                        break
                    got += count
                received_cpu.append((time.thread_time() - started) * 1000)

        receiver = threading.Thread(target=receive)
        receiver.start()
        with socket.create_connection(("127.0.0.1", port)) as sender:
            started = time.thread_time()
            for part in parts:
                sender.sendall(part)
            sent_cpu = (time.thread_time() - started) * 1000
            receiver.join()
    return sent_cpu, received_cpu[0]


def sendfile_cpu(directory: Path, body: bytes) -> float:
    """CPU ms of sending `body` from a file in the page cache to a loopback socket by sendfile
    (the sender's side; a thread receives and drops it)."""
    path = directory / f"sendfile-{os.getpid()}.bin"
    path.write_bytes(body)
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            receiver = threading.Thread(target=drain, args=(server, len(body)))
            receiver.start()
            with (
                socket.create_connection(server.getsockname()) as sender,
                path.open("rb") as file,
            ):
                started, offset = time.thread_time(), 0
                while offset < len(body):
                    offset += os.sendfile(sender.fileno(), file.fileno(), offset, len(body))
                cpu = (time.thread_time() - started) * 1000
            receiver.join()
    finally:
        path.unlink()
    return cpu


def drain(server: socket.socket, total: int) -> None:
    connection, _ = server.accept()
    with connection:
        buffer, got = bytearray(RECEIVE_PIECE), 0
        while got < total:
            count = connection.recv_into(buffer)
            if not count:
                return
            got += count


def file_create_ms(directory: Path) -> float:
    """CPU ms of creating one empty file, as a node creates one per block (the average of
    CREATES; on ext4 it grows with the files deleted in the minutes before)."""
    folder = directory / f"creates-{os.getpid()}"
    folder.mkdir()
    started = time.thread_time()
    for n in range(CREATES):
        os.close(os.open(folder / str(n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    cpu = (time.thread_time() - started) * 1000 / CREATES
    for n in range(CREATES):
        (folder / str(n)).unlink()
    folder.rmdir()
    return cpu


MEASURED = tuple(f.name for f in fields(Floor) if f.name not in ("mib", "replicas", "cores"))


def measure(directory: Path, mib: int = 64, replicas: int = 2, part_mib: int = 8) -> Floor:
    """The floor of a `mib` MiB PUT with `replicas` copies, its file writes in `directory`."""
    pattern = Pattern()
    part_mib = min(part_mib, mib)
    starts = range(0, mib, part_mib)
    parts = [pattern.part(1, first, part_mib) for first in starts]
    body = b"".join(parts)
    md5 = best(lambda: hashlib.md5(body, usedforsecurity=False).digest())
    checksum = best(lambda: xxhash.xxh3_128_hexdigest(body))
    build = best(lambda: [pattern.part(1, first, part_mib) for first in starts])
    transfers = [loopback_transfer(parts) for _ in range(REPEATS)]
    send = min(s for s, _ in transfers)
    hop = min(s + r for s, r in transfers)

    def compare(offset: int, piece: bytes) -> None:
        if not pattern.matches(1, offset, piece):
            raise RuntimeError(f"the bytes received at {offset} are not those sent")

    client_receive = min(loopback_transfer(parts, compare)[1] for _ in range(REPEATS))
    sendfile = min(sendfile_cpu(directory, body) for _ in range(REPEATS))
    file_create = min(file_create_ms(directory) for _ in range(REPEATS))
    os.sync()  # what others left dirty is not charged to our fsync
    writes = [node_write(directory, body) for _ in range(REPEATS)]
    walls = sorted(wall for _, wall in writes)
    return Floor(
        mib=mib,
        replicas=replicas,
        cores=os.cpu_count() or 1,
        md5=md5 / mib,
        block_checksum=checksum / mib,
        load_generator=(build + send) / mib,
        client_send=send / mib,
        node_write=min(cpu for cpu, _ in writes) / mib,
        transfer=hop / mib,
        disk_mib_s=mib / walls[len(walls) // 2],
        file_create=file_create / BLOCK_MIB,
        client_receive=client_receive / mib,
        sendfile=sendfile / mib,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="object size (default 64)")
    parser.add_argument("--replicas", type=int, default=2, help="copies written (default 2)")
    parser.add_argument("--dir", type=Path, help="where the file writes go (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-floor-", dir=args.dir) as scratch:
        print(measure(Path(scratch), args.mib, args.replicas).describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
