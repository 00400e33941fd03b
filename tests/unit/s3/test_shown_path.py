"""What the gateway's log lines show of a request's path: a presigned URL's signature hidden
(whoever holds the URL can send it until it expires)."""

from __future__ import annotations

import pytest

from shoal.s3.http import Headers, Request


@pytest.mark.parametrize(
    ("raw_path", "shown"),
    [
        ("/b/k", "/b/k"),
        ("/b/k?uploads", "/b/k?uploads"),
        (
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SHKEY%2F20240101&"
            "X-Amz-Signature=0a1b2c&X-Amz-Security-Token=tok",
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SHKEY%2F20240101&"
            "X-Amz-Signature=***&X-Amz-Security-Token=***",
        ),
        (
            "/b/k?AWSAccessKeyId=SHKEY&Expires=1&Signature=abc%2B%3D",
            "/b/k?AWSAccessKeyId=SHKEY&Expires=1&Signature=***",
        ),
        ("/b/k?prefix=Signature=x", "/b/k?prefix=Signature=x"),  # a value, not a parameter
    ],
)
def test_a_logged_path_hides_presigned_signatures(raw_path: str, shown: str) -> None:
    request = Request(None, "GET", raw_path, Headers(), True)  # type: ignore[arg-type]
    assert request.shown_path == shown
