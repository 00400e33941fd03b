"""Storage nodes over TLS: a node with a certificate serves HTTPS, clients check it."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shoal.ids import uuid7
from shoal.storage import BlockClient, NodeUnavailable, block_name
from tests.fixtures.storage import (
    MakeStorage,
    NodeProcess,
    StorageCluster,
    read_range,
    start_node,
    wait_until_registered,
)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal test node")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "node.crt", folder / "node.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls_node(make_storage: MakeStorage, run: Any) -> tuple[StorageCluster, NodeProcess, Path]:
    cluster = make_storage(nodes=0, node_workers=2)  # the workers serve TLS too
    root = cluster.config_file.parent
    cert, key = self_signed(root)
    with open(cluster.config_file, "a") as config:  # [storage] is the file's last table
        config.write(f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    node = start_node(cluster, "tls0", "dc0", root)
    cluster.nodes.append(node)
    wait_until_registered(cluster, run)
    return cluster, node, cert


def https(node: NodeProcess) -> str:
    return f"https://127.0.0.1:{node.port}"


def test_blocks_go_over_tls_to_a_node_with_a_certificate(
    tls_node: tuple[StorageCluster, NodeProcess, Path], run: Any
) -> None:
    cluster, node, cert = tls_node
    client = BlockClient(cluster.secret, tls_ca=cert)
    url = https(node)
    name = block_name(uuid7(), 0)
    data = os.urandom(700 * 1024)  # past the node's TLS send piece (256 KiB)

    async def round_trip() -> None:
        try:
            assert await client.put_block(url, name, data)
            assert await client.get_block(url, name) == data
            # A range past the TLS send piece too (a blocking read: nothing else runs meanwhile).
            piece = read_range(cluster.secret, url, name, 1000, 300_000, ca_file=cert)
            assert piece == data[1000:300_000]
            assert [b.name async for b in client.inventory(url)] == [name]
            assert await client.delete_blocks(url, [name]) == 1
            assert (await client.status(url)).name == "tls0"
        finally:
            await client.close()

    run(round_trip())
    # The node registered the address clients use: https.
    (registered,) = run(cluster.store.nodes.list(datetime.timedelta(days=1)))
    assert registered.url == url


def test_a_client_that_does_not_trust_the_certificate_sends_nothing(
    tls_node: tuple[StorageCluster, NodeProcess, Path], run: Any
) -> None:
    cluster, node, _ = tls_node
    client = BlockClient(cluster.secret)  # the system's CAs only

    async def status() -> None:
        try:
            await client.status(https(node))
        finally:
            await client.close()

    with pytest.raises(NodeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        run(status())


def test_plain_http_to_a_tls_node_gets_no_answer(
    tls_node: tuple[StorageCluster, NodeProcess, Path], run: Any
) -> None:
    cluster, node, cert = tls_node
    client = BlockClient(cluster.secret, tls_ca=cert)

    async def status() -> None:
        try:
            await client.status(f"http://127.0.0.1:{node.port}")
        finally:
            await client.close()

    with pytest.raises(NodeUnavailable):
        run(status())
    run(_status_over_tls(cluster, node, cert))  # the node still serves


async def _status_over_tls(cluster: StorageCluster, node: NodeProcess, cert: Path) -> None:
    client = BlockClient(cluster.secret, tls_ca=cert)
    try:
        assert (await client.status(https(node))).name == node.name
    finally:
        await client.close()
