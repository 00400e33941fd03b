"""Addressing: which bucket and key a Host header and path name."""

from __future__ import annotations

import pytest

from shoal.s3.errors import MethodNotAllowed, NotImplementedByShoal
from shoal.s3.router import Address, Endpoint, address, route

DOMAINS = ("localhost", "s3.localhost")


@pytest.mark.parametrize(
    ("host", "path", "expected"),
    [
        ("b.s3.localhost:9000", "/k", Address("b", "k", virtual=True)),
        ("b.localhost:9000", "/k", Address("b", "k", virtual=True)),
        ("a.b.s3.localhost", "/", Address("a.b", None, virtual=True)),
        ("s3.localhost:9000", "/b/k", Address("b", "k")),
        ("localhost:9000", "/b/k", Address("b", "k")),
        ("127.0.0.1:9000", "/b/%20k%20", Address("b", " k ")),
        ("B.S3.LOCALHOST", "/k", Address("b", "k", virtual=True)),
    ],
)
def test_the_longest_domain_wins_and_a_domain_alone_is_path_style(
    host: str, path: str, expected: Address
) -> None:
    assert address(host, path, DOMAINS) == expected
    assert address(host, path, tuple(reversed(DOMAINS))) == expected


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("PUT", Endpoint.PutBucketCors),
        ("GET", Endpoint.GetBucketCors),
        ("DELETE", Endpoint.DeleteBucketCors),
    ],
)
def test_cors_is_a_bucket_configuration(method: str, expected: Endpoint) -> None:
    assert route(method, Address("b", None), {"cors": ""}, copy_source=False) == expected
    # Objects have no CORS configuration of their own: never routed to PutObject and the like.
    with pytest.raises(NotImplementedByShoal):
        route(method, Address("b", "k"), {"cors": ""}, copy_source=False)
    with pytest.raises(MethodNotAllowed):
        route("POST", Address("b", None), {"cors": ""}, copy_source=False)


def test_a_post_to_a_bucket_is_a_form_upload_unless_it_deletes() -> None:
    assert route("POST", Address("b", None), {}, copy_source=False) == Endpoint.PostObject
    assert route("POST", Address("b", None), {"delete": ""}, copy_source=False) == (
        Endpoint.DeleteObjects
    )


@pytest.mark.parametrize(
    ("method", "where", "expected"),
    [
        ("GET", Address("b", None), Endpoint.GetBucketAcl),
        ("PUT", Address("b", None), Endpoint.PutBucketAcl),
        ("GET", Address("b", "k"), Endpoint.GetObjectAcl),
        ("PUT", Address("b", "k"), Endpoint.PutObjectAcl),
    ],
)
def test_acl_routes_never_to_the_plain_operation(
    method: str, where: Address, expected: Endpoint
) -> None:
    assert route(method, where, {"acl": ""}, copy_source=False) == expected
    # A PUT ?acl with a copy source is still an ACL, never a CopyObject.
    assert route(method, where, {"acl": ""}, copy_source=True) == expected
    with pytest.raises(MethodNotAllowed):
        route("DELETE", where, {"acl": ""}, copy_source=False)
