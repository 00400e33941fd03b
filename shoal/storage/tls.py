"""TLS for the traffic between Shoal processes and storage nodes (optional).

Tokens (auth.py) make a request impossible to forge or replay, but they do not hide what it
carries: blocks cross the network in the clear. Between hosts, node traffic runs over TLS
(`[storage] tls_cert` and `tls_key` on nodes, `tls_ca` on their clients) or on a private
network. On one machine, plain HTTP on loopback is the default.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerFiles:
    """A node's certificate chain and key (PEM); picklable, unlike an SSLContext, so that a
    node's worker processes make their own context from it."""

    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """What a client trusts for https:// node URLs: the CA bundle `ca_file`, else the system's.
    Host names are checked against the node's certificate."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
