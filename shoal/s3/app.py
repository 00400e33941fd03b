"""The S3 gateway: one handler per S3 operation, served over http.py.

Each request: request id, addressing and routing (router.py), SigV4 (sigv4.py), then the
operation's handler; a request with no credentials at all is anonymous, and goes to
access.py instead, which serves only what a public-read ACL opens. Errors become S3's XML
error body here and only here; an unexpected error is logged with the request id and
answered InternalError. Once a response body has started, an error can only abort the
connection, except in an answer that started early on purpose (`answer_while_working`),
whose error goes in its body. Every request gets one access line,
written once its answer is out (`make_unanswered`'s for one that never had its turn).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import parse_qsl, quote

from shoal import logs
from shoal.config import S3Config
from shoal.credentials import Credentials
from shoal.metadata import BucketNotFound, MetadataError, MetadataStore
from shoal.readiness import Readiness
from shoal.s3 import http, metrics, payload, sigv2, sigv4
from shoal.s3 import xml as s3xml
from shoal.s3.errors import (
    AccessDenied,
    IncompleteBody,
    InternalError,
    MaxMessageLengthExceeded,
    PreconditionFailed,
    RequestTimeout,
    S3Error,
    ServiceUnavailable,
    by_code,
    from_domain,
)
from shoal.s3.refusals import refuse_what_cannot_be_stored
from shoal.s3.router import Address, Endpoint, address, operation_name, route
from shoal.storage import DataPath, DataUnavailable, StorageUnavailable

log = logging.getLogger("shoal.s3")
# What a 503 tells the client to wait before trying again: outages Shoal can ride out (a
# shard restarting, a node coming back) last seconds.
RETRY_AFTER_SECONDS = 1
access_log = logs.AccessLog()

Handler = Callable[["Call"], Awaitable[http.Response]]
HANDLERS: dict[Endpoint, Handler] = {}


def handles(endpoint: Endpoint) -> Callable[[Handler], Handler]:
    """Register a handler for an S3 operation (handlers live in bucket.py, object.py, ...)."""

    def register(handler: Handler) -> Handler:
        HANDLERS[endpoint] = handler
        return handler

    return register


@dataclass
class Gateway:
    store: MetadataStore
    data: DataPath
    credentials: Credentials
    config: S3Config
    readiness: Readiness | None = None  # None: always ready (a gateway in a test)


class Authenticated(Protocol):
    """What authenticated a request, and the body as it lets handlers read it: a signed
    request's `sigv4.Verified`, a SigV2 request's `UnsignedBody`, a form upload's
    `post.PostedForm`."""

    trailers: dict[str, str]

    def body(self, raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]: ...


@dataclass
class Call:
    """One authenticated S3 request, as handlers see it."""

    gateway: Gateway
    request: http.Request
    request_id: str
    endpoint: Endpoint
    where: Address
    account: uuid.UUID
    verified: Authenticated
    query: dict[str, str]  # the query string's parameters, decoded
    # Served to a stranger by a public-read ACL (access.py): an object read then serves only
    # a version that is public-read itself, whatever replaced the one access.py checked.
    public_only: bool = False

    @property
    def bucket(self) -> str:
        assert self.where.bucket is not None
        return self.where.bucket

    @property
    def key(self) -> str:
        assert self.where.key is not None
        return self.where.key

    @property
    def object_url(self) -> str:
        """The object's URL, addressed as this request addressed it (an answer's
        `Location`): its key percent-encoded, as S3 gives it."""
        host = self.request.host or "localhost"
        if self.where.virtual:
            return f"http://{host}/{quote(self.key)}"
        return f"http://{host}/{quote(self.bucket)}/{quote(self.key)}"

    @property
    def store(self) -> MetadataStore:
        return self.gateway.store

    @property
    def data(self) -> DataPath:
        return self.gateway.data

    def body(self) -> AsyncIterator[bytes]:
        """The request body as the client meant it (aws-chunked decoded, signatures checked)."""
        return self.verified.body(self.request.body)

    async def read_body(self, limit: int, *, digests_of_body: bool = True) -> bytes:
        """A small body (XML), whole, its Content-MD5 and x-amz-checksum-* checked
        (payload.check_small_body) unless those are not the body's (`digests_of_body`);
        S3's MaxMessageLengthExceeded past `limit` bytes, refused before reading when the
        declared length already says so."""
        declared = self.request.content_length
        if declared is not None and declared > limit:
            raise MaxMessageLengthExceeded()
        received = bytearray()
        async for chunk in self.body():
            received += chunk
            if len(received) > limit:
                raise MaxMessageLengthExceeded()
        body = bytes(received)
        if digests_of_body:
            payload.check_small_body(self.request.headers, self.verified.trailers, body)
        return body


def make_handler(gateway: Gateway) -> http.Handler:
    """What http.serve calls for each request."""
    # Import the handler modules so that they register themselves.
    from shoal.s3 import (  # noqa: F401
        acl,
        attributes,
        bucket,
        cors,
        inventory,
        lifecycle,
        listing,
        multipart,
        objects,
        post,
        tagging,
    )

    async def dispatch(request: http.Request) -> http.Response:
        return await handle(gateway, request)

    return dispatch


def make_unanswered(gateway: Gateway) -> Callable[[http.Request], None]:
    """What http.serve calls for a request it never handed to the handler (its client left
    before its turn): its access line, with no status."""

    def unanswered(request: http.Request) -> None:
        _log_access(gateway, request, next_request_id(), None, None, time.monotonic())

    return unanswered


# Request ids: this process's random tag, then a counter (unique per process, as S3's are
# per request; a fresh random id cost a getrandom call per request).
_PROCESS_TAG = secrets.token_hex(4).upper()
_REQUEST_NUMBERS = itertools.count()


def next_request_id() -> str:
    return f"{_PROCESS_TAG}{next(_REQUEST_NUMBERS) & 0xFFFFFFFF:08X}"


async def handle(gateway: Gateway, request: http.Request) -> http.Response:
    request_id = next_request_id()
    request.response_headers["x-amz-request-id"] = request_id
    started = time.monotonic()
    call: Call | None = None
    counted = metrics.gateway()
    counted.started()

    def log_access(response: http.Response | None) -> None:
        counted.finished()
        _log_access(gateway, request, request_id, call, response, started)

    request.answered = log_access
    try:
        readiness = gateway.readiness
        if readiness is not None and not readiness.serving and not await readiness.confirm():
            raise ServiceUnavailable()  # starting, or too few storage nodes answer
        if request.method == "OPTIONS":
            return await _preflight(gateway, request)
        call = await _authenticated_call(gateway, request, request_id)
        if "origin" in request.headers:
            from shoal.s3 import cors  # imports this module

            await cors.add_headers(call)
        from shoal.s3 import access  # imports this module

        handler: Handler
        if call.account == ANONYMOUS:
            handler = access.serve_anonymous  # a stranger's write learns only AccessDenied
        else:
            refuse_what_cannot_be_stored(call.endpoint, request.headers)
            handler = HANDLERS[call.endpoint]
        try:
            response = await handler(call)
        except BucketNotFound:
            if call.endpoint not in access.OPEN_READS:
                await refuse_foreign_bucket(call, call.bucket)
                raise
            # Perhaps another account's bucket: what public-read opens to everyone, as in S3.
            if await call.store.buckets.owner_of(call.bucket) is None:
                raise
            response = await access.serve_anonymous(call)
    except Exception as exc:
        if request.response_started:
            log.error("request %s failed after its response started: %r", request_id, exc)
            raise
        counted.refused(exc)
        response = _error_response(request, request_id, _as_s3_error(exc, request_id))
    return response


async def _preflight(gateway: Gateway, request: http.Request) -> http.Response:
    """A browser's CORS preflight, answered before (and without) authentication, as S3 does."""
    from shoal.s3 import cors  # imports this module

    return await cors.preflight(gateway.store, request, _target(gateway, request)[2])


async def refuse_foreign_bucket(call: Call, bucket: str) -> None:
    """AccessDenied if `bucket`, which the caller does not have, is another account's: S3
    answers so, not NoSuchBucket (for the bucket addressed, and for a copy's source)."""
    owner = await call.store.buckets.owner_of(bucket)
    if owner is not None and owner != call.account:
        raise AccessDenied() from None


def _target(gateway: Gateway, request: http.Request) -> tuple[str, list[tuple[str, str]], Address]:
    """The request's raw path, its query's parameters and the bucket and key it names."""
    raw_path, _, raw_query = request.raw_path.partition("?")
    query_pairs = (
        parse_qsl(raw_query, keep_blank_values=True, errors="surrogateescape") if raw_query else []
    )
    return raw_path, query_pairs, address(request.host, raw_path, gateway.config.domains)


async def _authenticated_call(gateway: Gateway, request: http.Request, request_id: str) -> Call:
    raw_path, query_pairs, where = _target(gateway, request)
    query = dict(query_pairs)
    endpoint = route(request.method, where, query, "x-amz-copy-source" in request.headers)
    if endpoint is Endpoint.PostObject:
        # A browser form's upload: signed by a policy in its form fields, not its head.
        from shoal.s3 import post  # imports this module

        return await post.authenticated_call(gateway, request, request_id, where, query)
    signed = sigv4.SignedRequest(
        method=request.method,
        raw_path=raw_path,
        query=query_pairs,
        headers=request.headers,
    )
    if _carries_no_credentials(request, query):
        # Anonymous: only what a public-read ACL opens is served (access.py).
        return Call(gateway, request, request_id, endpoint, where, ANONYMOUS, UnsignedBody(), query)
    now = datetime.now(UTC)
    if sigv2.is_sigv2(signed):
        # Version 2 still signs the presigned URLs of boto3's default client in us-east-1.
        sigv2.refuse_if_off(signed, gateway.config.signature_v2)
        v2 = sigv2.parse(signed, now)
        account, secret = await gateway.credentials.secret_of(v2.access_key_id)
        sigv2.verify(v2, signed, secret, host_bucket=where.bucket if where.virtual else None)
        unsigned = UnsignedBody()
        return Call(gateway, request, request_id, endpoint, where, account, unsigned, query)
    credentials = sigv4.parse(signed, now)
    account, secret = await gateway.credentials.secret_of(credentials.access_key_id)
    verified = sigv4.verify(credentials, signed, secret)
    return Call(gateway, request, request_id, endpoint, where, account, verified, query)


# The account of a request that carries no credentials at all (no Authorization header, no
# presigned URL's parameters); no account has this id.
ANONYMOUS = uuid.UUID(int=0)
_CREDENTIAL_PARAMETERS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Signature",
    "AWSAccessKeyId",
    "Signature",
)


def _carries_no_credentials(request: http.Request, query: dict[str, str]) -> bool:
    return "authorization" not in request.headers and not any(
        name in query for name in _CREDENTIAL_PARAMETERS
    )


class UnsignedBody:
    """The body of a SigV2 request: not signed, passed through as sent."""

    trailers: dict[str, str] = {}  # noqa: RUF012 - never filled: SigV2 has no trailers

    def body(self, raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return raw


def _as_s3_error(error: Exception, request_id: str) -> S3Error:
    if isinstance(error, S3Error):
        return error
    if isinstance(error, http.BodyTimeout):
        return RequestTimeout()
    if isinstance(error, http.BodyIncomplete):
        # The client's doing, not the gateway's: answered (if it still reads), not logged.
        return IncompleteBody()
    if isinstance(error, sigv4.SigV4Error):
        mapped = by_code(error.code, error.message)
        mapped.fields = dict(error.details)
        return mapped
    if isinstance(error, MetadataError | StorageUnavailable | DataUnavailable):
        domain = from_domain(error)
        if domain is not None:
            return domain
    log.exception("request %s failed", request_id, exc_info=error)
    return InternalError()


def _error_response(request: http.Request, request_id: str, error: S3Error) -> http.Response:
    headers: dict[str, str] = {}  # x-amz-request-id: every response has it (handle)
    if error.status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    if error.status == 416 and "ActualObjectSize" in error.fields:
        headers["Content-Range"] = f"bytes */{error.fields['ActualObjectSize']}"
    if isinstance(error, PreconditionFailed) and "Condition" not in error.fields:
        # A write's or a delete's condition, which the metadata tier checked: the request
        # carries one of the two at most.
        sent = [name for name in ("If-Match", "If-None-Match") if name in request.headers]
        if sent:
            error.fields["Condition"] = sent[0]
    if request.method == "HEAD":
        return http.Response(status=error.status, headers=headers)
    body = s3xml.error_document(error.code, error.message, request.path, request_id, error.fields)
    return http.Response(
        status=error.status, body=body, headers=headers, content_type="application/xml"
    )


def _log_access(
    gateway: Gateway,
    request: http.Request,
    request_id: str,
    call: Call | None,
    response: http.Response | None,
    started: float,
) -> None:
    # Body bytes (not the head), as S3's access logs count them: what arrived of the request
    # body (read or drained; aws-chunked framing included, HTTP chunked framing not), and
    # what was written of the response body, however far it got. `cut`: the answer was cut
    # short (the client left, or an error after the head). The metrics count the same.
    seconds = time.monotonic() - started
    account = "-" if call is None else "anonymous" if call.account == ANONYMOUS else call.account
    operation = call.endpoint.name if call else _operation_of(gateway, request)
    received = request.body.received
    status = response.status if response is not None else None
    sent = response.body_bytes_sent if response is not None else 0
    if response is not None:
        counted_as = operation if operation != "-" else metrics.UNKNOWN_OPERATION
        metrics.gateway().answered(counted_as, response.status, received, sent, seconds)
    cut = isinstance(response, http.StreamResponse) and response.prepared and not response.finished
    access_log.request(
        request_id,
        account=str(account),
        operation=operation,
        status=status,
        bytes_in=received,
        bytes_out=sent,
        seconds=seconds,
        cut=cut,
    )


def _operation_of(gateway: Gateway, request: http.Request) -> str:
    """The operation a request that never became a Call asked for (refused before or at
    routing, or by authentication), named as S3 names it, also when Shoal does not
    implement it."""
    if request.method == "OPTIONS":
        return "PreflightRequest"  # a browser's CORS preflight (cors.py); S3 names no operation
    try:
        _, query_pairs, where = _target(gateway, request)
        copy = "x-amz-copy-source" in request.headers
        return operation_name(request.method, where, dict(query_pairs), copy)
    except Exception:  # a target too broken to name
        return "-"


# A copy from a source of at least this many bytes answers at once (S3 does so for every
# copy): 200 OK, its head and the XML declaration, a space every WHITESPACE_SECONDS while it
# copies, then the XML result or an Error document (the declaration must come first: XML
# parsers, botocore's among them, refuse whitespace before it). Below it, a copy ends well
# within clients' read timeouts (60 s for boto3), and keeps a plain answer with its error's
# own status.
EARLY_ANSWER_BYTES = 32 * 1024 * 1024
WHITESPACE_SECONDS = 2.0


async def answer_while_working(
    call: Call, size: int, work: Callable[[], Awaitable[bytes]]
) -> http.Response:
    """The XML answer that `work` makes, for an operation on `size` bytes of data: whole
    when small; when large, a 200 sent at once and kept alive with whitespace until `work`
    ends, its result or its error (as S3's Error document) in the body."""
    if size < EARLY_ANSWER_BYTES:
        return http.Response(body=await work(), content_type="application/xml")
    response = http.StreamResponse(headers={"Content-Type": "application/xml"}, chunked=True)
    await response.prepare(call.request)
    working = asyncio.ensure_future(work())
    declaration = s3xml.DECLARATION.encode()
    try:
        await response.write(declaration)
        while not working.done():
            await response.write(b" ")
            await asyncio.wait({working}, timeout=WHITESPACE_SECONDS)
    except BaseException:
        # The client left: the work goes on to its end all the same (its commit is not cut
        # in half), then the answer is dropped.
        await asyncio.wait({working})
        if not working.cancelled() and working.exception() is not None:
            log.info("request %s: %r after its client left", call.request_id, working.exception())
        raise
    try:
        body = working.result()
    except Exception as exc:
        error = _as_s3_error(exc, call.request_id)
        body = s3xml.error_document(
            error.code, error.message, call.request.path, call.request_id, error.fields
        )
    await response.write(body.removeprefix(declaration))
    await response.write_eof()
    return response
