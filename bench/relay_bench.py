"""What relaying a GET's bytes costs the gateway: through its memory, or spliced.

    .venv/bin/python bench/relay_bench.py                     # 2 GiB a way, 3 rounds
    .venv/bin/python bench/relay_bench.py --mib 512 --rounds 5

A 64 MiB GET through Shoal moves each byte from a storage node's socket to the client's
through the gateway. Shoal's gateway receives a block into its memory (checking its
checksum there) and writes it to the client's socket: two copies by the kernel. splice(2)
could move the bytes from one socket to the other through a pipe without them entering the
process, the checksum then checked on the node. This measures the relaying thread's CPU per
MiB both ways, on the same loopback connections:

  copy           recv_into a reused 4 MiB buffer, then sendall of what arrived
  splice PIPE    splice from the source socket into a pipe of PIPE bytes, then from the
                 pipe to the destination socket

The source sends a file from the page cache by sendfile (as a storage node does), the
destination receives into a reused buffer (neither is counted). What the gateway's
relaying could save is the difference; its checksum (XXH3, cpu_floor.py) is left out of
both.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MIB = 1024 * 1024
BUFFER = 4 * MIB  # a block, as the gateway receives one
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's fcntl.h
PIPE_SIZES = (64 * 1024, 256 * 1024, MIB)  # 1 MiB: Linux's pipe-max-size by default
FILE_MIB = 64

Relay = Callable[[socket.socket, socket.socket], None]


def relay_by_copy(source: socket.socket, destination: socket.socket) -> None:
    view = memoryview(bytearray(BUFFER))
    while count := source.recv_into(view):
        destination.sendall(view[:count])


def relay_by_splice(pipe_size: int) -> Relay:
    def relay(source: socket.socket, destination: socket.socket) -> None:
        read_end, write_end = os.pipe()
        try:
            fcntl.fcntl(write_end, F_SETPIPE_SZ, pipe_size)
            while count := os.splice(source.fileno(), write_end, pipe_size):
                while count:
                    count -= os.splice(read_end, destination.fileno(), count)
        finally:
            os.close(read_end)
            os.close(write_end)

    return relay


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def send_file(sock: socket.socket, path: Path, total: int) -> None:
    with sock, path.open("rb") as file:
        size, sent = path.stat().st_size, 0
        while sent < total:
            sent += os.sendfile(sock.fileno(), file.fileno(), 0, min(size, total - sent))
        sock.shutdown(socket.SHUT_WR)


def receive_all(sock: socket.socket) -> None:
    view = memoryview(bytearray(BUFFER))
    with sock:
        while sock.recv_into(view):
            pass


def relay_once(relay: Relay, path: Path, total: int) -> tuple[float, float]:
    """(CPU ms per MiB of the relaying thread, MiB/s) of relaying `total` bytes."""
    node_side, gateway_in = connected_pair()
    gateway_out, client_side = connected_pair()
    ends = [
        threading.Thread(target=send_file, args=(node_side, path, total)),
        threading.Thread(target=receive_all, args=(client_side,)),
    ]
    for end in ends:
        end.start()
    with gateway_in, gateway_out:
        started, started_cpu = time.perf_counter(), time.thread_time()
        relay(gateway_in, gateway_out)
        gateway_out.shutdown(socket.SHUT_WR)
        cpu, wall = time.thread_time() - started_cpu, time.perf_counter() - started
    for end in ends:
        end.join()
    mib = total / MIB
    return cpu * 1000 / mib, mib / wall


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=2048, help="MiB relayed a round (2048)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each way (3)")
    args = parser.parse_args(argv)
    ways: dict[str, Relay] = {"copy": relay_by_copy}
    ways |= {f"splice {size // 1024} KiB": relay_by_splice(size) for size in PIPE_SIZES}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="shoal-relay-") as scratch:
        path = Path(scratch) / "block-source.bin"
        path.write_bytes(os.urandom(FILE_MIB * MIB))
        for _ in range(args.rounds):  # the ways alternate, so that a slow spell hits all
            for name, relay in ways.items():
                results[name].append(relay_once(relay, path, args.mib * MIB))
    print(f"relaying {args.mib} MiB between two loopback sockets, {args.rounds} rounds each")
    print("| way | relaying CPU ms/MiB (median; rounds) | MiB/s (median) |")
    print("|---|---|---|")
    for name, rounds in results.items():
        cpus = [cpu for cpu, _ in rounds]
        rates = [rate for _, rate in rounds]
        shown = " / ".join(f"{cpu:.3f}" for cpu in cpus)
        cpu, rate = statistics.median(cpus), statistics.median(rates)
        print(f"| {name} | {cpu:.3f} ({shown}) | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
