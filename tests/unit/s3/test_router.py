"""Addressing (which bucket and key a Host header and path name) and routing (which S3
operation a method, an address and a query are)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import botocore.session
import pytest

from shoal.s3.errors import MethodNotAllowed, NotImplementedByShoal
from shoal.s3.router import UNSUPPORTED, Address, Endpoint, address, operation_name, route

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


def test_inventory_is_a_bucket_configuration() -> None:
    # Without an id, the handler refuses a PUT or DELETE (InvalidArgument); a GET lists.
    assert route("PUT", Address("b", None), {"inventory": ""}, copy_source=False) == (
        Endpoint.PutBucketInventoryConfiguration
    )
    with pytest.raises(NotImplementedByShoal):
        route("PUT", Address("b", "k"), {"inventory": "", "id": "i"}, copy_source=False)
    with pytest.raises(MethodNotAllowed):
        route("POST", Address("b", None), {"inventory": ""}, copy_source=False)


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


BUCKET = Address("b", None)
OBJECT = Address("b", "k")
ROOT = Address(None, None)

# Every operation Shoal serves, from its method, address, query and whether it names a copy
# source: (method, where, query, copy_source, endpoint).
ROUTES = [
    ("GET", ROOT, {}, False, Endpoint.ListBuckets),
    ("PUT", BUCKET, {}, False, Endpoint.CreateBucket),
    ("HEAD", BUCKET, {}, False, Endpoint.HeadBucket),
    ("DELETE", BUCKET, {}, False, Endpoint.DeleteBucket),
    ("GET", BUCKET, {"location": ""}, False, Endpoint.GetBucketLocation),
    ("GET", BUCKET, {"versioning": ""}, False, Endpoint.GetBucketVersioning),
    ("GET", BUCKET, {}, False, Endpoint.ListObjects),
    ("GET", BUCKET, {"prefix": "a/", "delimiter": "/"}, False, Endpoint.ListObjects),
    ("GET", BUCKET, {"list-type": "2"}, False, Endpoint.ListObjectsV2),
    ("GET", BUCKET, {"list-type": "1"}, False, Endpoint.ListObjects),
    ("GET", BUCKET, {"versions": ""}, False, Endpoint.ListObjectVersions),
    ("GET", BUCKET, {"uploads": ""}, False, Endpoint.ListMultipartUploads),
    ("POST", BUCKET, {"delete": ""}, False, Endpoint.DeleteObjects),
    ("POST", BUCKET, {}, False, Endpoint.PostObject),
    ("PUT", OBJECT, {}, False, Endpoint.PutObject),
    ("PUT", OBJECT, {}, True, Endpoint.CopyObject),
    ("GET", OBJECT, {}, False, Endpoint.GetObject),
    ("GET", OBJECT, {"versionId": "null"}, False, Endpoint.GetObject),
    ("GET", OBJECT, {"partNumber": "1"}, False, Endpoint.GetObject),
    ("GET", OBJECT, {"response-content-type": "a/b"}, False, Endpoint.GetObject),
    ("HEAD", OBJECT, {}, False, Endpoint.HeadObject),
    ("HEAD", OBJECT, {"partNumber": "2"}, False, Endpoint.HeadObject),
    ("DELETE", OBJECT, {}, False, Endpoint.DeleteObject),
    ("DELETE", OBJECT, {"versionId": "null"}, False, Endpoint.DeleteObject),
    ("POST", OBJECT, {"uploads": ""}, False, Endpoint.CreateMultipartUpload),
    ("PUT", OBJECT, {"partNumber": "1", "uploadId": "u"}, False, Endpoint.UploadPart),
    ("PUT", OBJECT, {"partNumber": "1", "uploadId": "u"}, True, Endpoint.UploadPartCopy),
    ("POST", OBJECT, {"uploadId": "u"}, False, Endpoint.CompleteMultipartUpload),
    ("DELETE", OBJECT, {"uploadId": "u"}, False, Endpoint.AbortMultipartUpload),
    ("GET", OBJECT, {"uploadId": "u"}, False, Endpoint.ListParts),
    ("GET", OBJECT, {"uploadId": "u", "max-parts": "5"}, False, Endpoint.ListParts),
    ("GET", OBJECT, {"attributes": ""}, False, Endpoint.GetObjectAttributes),
    ("PUT", BUCKET, {"lifecycle": ""}, False, Endpoint.PutBucketLifecycleConfiguration),
    ("GET", BUCKET, {"lifecycle": ""}, False, Endpoint.GetBucketLifecycleConfiguration),
    ("DELETE", BUCKET, {"lifecycle": ""}, False, Endpoint.DeleteBucketLifecycle),
    ("PUT", BUCKET, {"cors": ""}, False, Endpoint.PutBucketCors),
    ("GET", BUCKET, {"cors": ""}, False, Endpoint.GetBucketCors),
    ("DELETE", BUCKET, {"cors": ""}, False, Endpoint.DeleteBucketCors),
    ("PUT", BUCKET, {"inventory": "", "id": "i"}, False, Endpoint.PutBucketInventoryConfiguration),
    ("GET", BUCKET, {"inventory": "", "id": "i"}, False, Endpoint.GetBucketInventoryConfiguration),
    ("GET", BUCKET, {"inventory": ""}, False, Endpoint.ListBucketInventoryConfigurations),
    (
        "DELETE",
        BUCKET,
        {"inventory": "", "id": "i"},
        False,
        Endpoint.DeleteBucketInventoryConfiguration,
    ),
    ("PUT", OBJECT, {"tagging": ""}, False, Endpoint.PutObjectTagging),
    ("GET", OBJECT, {"tagging": ""}, False, Endpoint.GetObjectTagging),
    ("DELETE", OBJECT, {"tagging": ""}, False, Endpoint.DeleteObjectTagging),
    ("PUT", BUCKET, {"tagging": ""}, False, Endpoint.PutBucketTagging),
    ("GET", BUCKET, {"tagging": ""}, False, Endpoint.GetBucketTagging),
    ("DELETE", BUCKET, {"tagging": ""}, False, Endpoint.DeleteBucketTagging),
    ("GET", BUCKET, {"acl": ""}, False, Endpoint.GetBucketAcl),
    ("PUT", BUCKET, {"acl": ""}, False, Endpoint.PutBucketAcl),
    ("GET", OBJECT, {"acl": ""}, False, Endpoint.GetObjectAcl),
    ("PUT", OBJECT, {"acl": ""}, False, Endpoint.PutObjectAcl),
]


@pytest.mark.parametrize(
    ("method", "where", "query", "copy_source", "expected"),
    ROUTES,
    ids=[
        f"{r[4].name}-{r[0]}-{'&'.join(r[2]) or 'plain'}{'-copy' if r[3] else ''}" for r in ROUTES
    ],
)
def test_each_operation_routes_from_method_address_and_query(
    method: str, where: Address, query: dict[str, str], copy_source: bool, expected: Endpoint
) -> None:
    assert route(method, where, query, copy_source) == expected
    assert operation_name(method, where, query, copy_source) == expected.name


def test_the_table_names_every_operation_shoal_serves() -> None:
    assert {r[4] for r in ROUTES} == set(Endpoint)


@pytest.mark.parametrize(
    ("host", "path_style", "virtual_hosted"),
    [
        ("s3.localhost:9000", "/b/k", ("b.s3.localhost:9000", "/k")),
        ("s3.localhost", "/b/a/b/c.txt", ("b.s3.localhost", "/a/b/c.txt")),
        ("s3.localhost", "/b/", ("b.s3.localhost", "/")),
        ("s3.localhost", "/b", ("b.s3.localhost", "")),
    ],
)
def test_virtual_hosted_and_path_style_name_the_same_bucket_and_key(
    host: str, path_style: str, virtual_hosted: tuple[str, str]
) -> None:
    by_path = address(host, path_style, DOMAINS)
    by_host = address(*virtual_hosted, DOMAINS)
    assert (by_path.bucket, by_path.key) == (by_host.bucket, by_host.key)
    assert (by_path.virtual, by_host.virtual) == (False, True)
    for method in ("GET", "PUT", "HEAD", "DELETE"):
        assert route(method, by_path, {}, False) == route(method, by_host, {}, False)


@pytest.mark.parametrize(
    ("host", "path", "expected"),
    [
        ("example.com", "/b/k", Address("b", "k")),  # outside every domain: path style
        ("notlocalhost", "/b/k", Address("b", "k")),  # a suffix that is not a whole label
        ("", "/b/k", Address("b", "k")),
        ("[::1]:9000", "/b/k", Address("b", "k")),
        ("localhost", "/", Address(None, None)),
        ("localhost", "", Address(None, None)),
        ("localhost", "/b/a//b/", Address("b", "a//b/")),  # a key keeps its slashes
        ("localhost", "/b/a%2Fb", Address("b", "a/b")),
        ("localhost", "/b/caf%C3%A9", Address("b", "café")),
        ("localhost", "/b/%FF", Address("b", "\udcff")),  # not UTF-8: refused later, not here
    ],
)
def test_path_style_addresses(host: str, path: str, expected: Address) -> None:
    assert address(host, path, DOMAINS) == expected


@pytest.mark.parametrize(
    ("method", "where", "query", "copy_source", "expected"),
    [
        # A sub-resource with a copy source is never a CopyObject or an UploadPartCopy.
        ("PUT", OBJECT, {"tagging": ""}, True, Endpoint.PutObjectTagging),
        ("PUT", OBJECT, {"acl": "", "uploadId": "u"}, True, Endpoint.PutObjectAcl),
        # A sub-resource wins over the parameters of a plain operation.
        ("GET", OBJECT, {"tagging": "", "uploadId": "u"}, False, Endpoint.GetObjectTagging),
        ("DELETE", OBJECT, {"tagging": "", "uploadId": "u"}, False, Endpoint.DeleteObjectTagging),
        ("GET", OBJECT, {"attributes": "", "uploadId": "u"}, False, Endpoint.GetObjectAttributes),
        ("GET", BUCKET, {"tagging": "", "list-type": "2"}, False, Endpoint.GetBucketTagging),
        ("DELETE", BUCKET, {"lifecycle": ""}, False, Endpoint.DeleteBucketLifecycle),
        ("PUT", BUCKET, {"acl": "", "tagging": ""}, False, Endpoint.PutBucketAcl),
        ("GET", BUCKET, {"uploads": "", "prefix": "x"}, False, Endpoint.ListMultipartUploads),
    ],
)
def test_sub_resources_never_fall_through_to_the_plain_operation(
    method: str, where: Address, query: dict[str, str], copy_source: bool, expected: Endpoint
) -> None:
    assert route(method, where, query, copy_source) == expected


def _unsupported_cases() -> list[tuple[str, Address, str]]:
    cases = []
    for resource in sorted(UNSUPPORTED):
        for where in (BUCKET, OBJECT):
            for method in ("GET", "PUT", "DELETE", "POST", "HEAD"):
                if resource == "attributes" and where is OBJECT and method == "GET":
                    continue  # GetObjectAttributes
                if resource in ("cors", "inventory") and where is BUCKET:
                    continue  # the bucket's CORS and inventory configurations
                cases.append((method, where, resource))
    return cases


@pytest.mark.parametrize(("method", "where", "resource"), _unsupported_cases())
def test_sub_resources_shoal_lacks_are_not_implemented_never_misrouted(
    method: str, where: Address, resource: str
) -> None:
    for copy_source in (False, True):
        with pytest.raises(NotImplementedByShoal, match=resource):
            route(method, where, {resource: "", "uploadId": "u"}, copy_source)
    assert operation_name(method, where, {resource: ""}, False) not in {e.name for e in Endpoint}


def test_buckets_cannot_be_made_versioned() -> None:
    with pytest.raises(NotImplementedByShoal):
        route("PUT", BUCKET, {"versioning": ""}, copy_source=False)


@pytest.mark.parametrize(
    ("method", "where", "query"),
    [
        ("PUT", ROOT, {}),
        ("DELETE", ROOT, {}),
        ("POST", ROOT, {}),
        ("PATCH", BUCKET, {}),
        ("PATCH", OBJECT, {}),
        ("OPTIONS", OBJECT, {}),  # preflights are answered before routing (cors.py)
        ("POST", OBJECT, {}),  # neither a new upload nor a completion
        ("POST", BUCKET, {"lifecycle": ""}),
        ("HEAD", BUCKET, {"tagging": ""}),
        ("POST", OBJECT, {"tagging": ""}),
        ("DELETE", OBJECT, {"acl": ""}),
        # A sub-resource with the wrong method is never the plain operation: a DELETE
        # /bucket?uploads deleted the bucket, a DELETE /bucket/key?uploads the object.
        *(("DELETE", BUCKET, {r: ""}) for r in ("uploads", "versions", "location", "delete")),
        ("DELETE", BUCKET, {"list-type": "2"}),
        *(("PUT", BUCKET, {r: ""}) for r in ("uploads", "versions", "location", "delete")),
        ("POST", BUCKET, {"uploads": ""}),
        ("DELETE", OBJECT, {"uploads": ""}),
        ("PUT", OBJECT, {"uploads": ""}),
        ("DELETE", OBJECT, {"partNumber": "1"}),
    ],
)
def test_a_method_an_operation_does_not_have_is_not_allowed(
    method: str, where: Address, query: dict[str, str]
) -> None:
    with pytest.raises(MethodNotAllowed):
        route(method, where, query, copy_source=False)
    assert operation_name(method, where, query, False) == "-"


@pytest.mark.parametrize(
    ("method", "where", "query", "expected"),
    [
        ("GET", BUCKET, {"policy": ""}, "GetBucketPolicy"),
        ("PUT", BUCKET, {"object-lock": ""}, "PutBucketObjectLockConfiguration"),
        ("GET", OBJECT, {"legal-hold": ""}, "GetObjectLegalHold"),
        ("POST", OBJECT, {"restore": ""}, "RestoreObject"),
        ("POST", OBJECT, {"select": "", "select-type": "2"}, "SelectObjectContent"),
        ("PUT", BUCKET, {"versioning": ""}, "PutBucketVersioning"),
        ("PUT", BUCKET, {"publicAccessBlock": ""}, "PutBucketPublicAccessBlock"),
        ("DELETE", BUCKET, {"website": ""}, "DeleteBucketWebsite"),
    ],
)
def test_operations_shoal_lacks_are_logged_by_their_s3_names(
    method: str, where: Address, query: dict[str, str], expected: str
) -> None:
    assert operation_name(method, where, query, copy_source=False) == expected


def _botocore_operations() -> list[tuple[str, str, bool, dict[str, str]]]:
    """(name, method, names a key, query) of each S3 operation in botocore's model whose
    request URI names a sub-resource: S3's own list of what must not be misrouted. The query
    holds the parameters the operation requires too (GetBucketInventoryConfiguration is
    ListBucketInventoryConfigurations with an `id`)."""
    model = botocore.session.get_session().get_service_model("s3")
    found = []
    for name in model.operation_names:
        operation = model.operation_model(name)
        path, _, query = operation.http["requestUri"].partition("?")
        if query and "{Bucket}" in path:
            parameters = dict(parse_qsl(query, True))
            shape = operation.input_shape
            for member in shape.required_members if shape is not None else ():
                where = shape.members[member].serialization
                if where.get("location") == "querystring":
                    parameters[where["name"]] = "x"
            found.append((name, operation.http["method"], "{Key+}" in path, parameters))
    return found


# Operations S3 has under two names, Shoal serving them under the newer one.
_SAME_OPERATION = {
    "GetBucketLifecycle": "GetBucketLifecycleConfiguration",
    "PutBucketLifecycle": "PutBucketLifecycleConfiguration",
}


@pytest.mark.parametrize(
    ("name", "method", "keyed", "query"), _botocore_operations(), ids=lambda v: str(v)
)
def test_every_s3_sub_resource_routes_to_its_operation_or_is_not_implemented(
    name: str, method: str, keyed: bool, query: dict[str, str]
) -> None:
    where = OBJECT if keyed else BUCKET
    for copy_source in (False, True):
        try:
            routed = route(method, where, query, copy_source).name
        except NotImplementedByShoal:
            continue
        assert routed == _SAME_OPERATION.get(name, name)
