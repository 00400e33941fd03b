"""TCP ports on the loopback interface."""

from __future__ import annotations

import socket
import threading

# Ports this process has handed out. A caller binds its port later, often in a child process
# that is still importing, and the kernel may meanwhile pick the same free port for the next
# caller: two nodes (or a node and PostgreSQL) started together then collide.
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A port nothing listens on right now (the kernel picks it), never one this process
    handed out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        with _lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
