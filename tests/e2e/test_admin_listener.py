"""The admin listener of `shoal serve` and of its storage nodes: health, readiness, metrics,
and the token that guards the admin API and the console."""

from __future__ import annotations

import json

from tests.fixtures.admin import admin_get, bearer, log_in, node_admin_ports
from tests.fixtures.serve import Served


def test_health_and_ready_answer_without_a_token(served: Served) -> None:
    status, _, body = admin_get(served.admin_port, "/health")
    assert status == 200 and json.loads(body)["status"] == "alive"
    status, headers, body = admin_get(served.admin_port, "/ready")
    report = json.loads(body)
    assert status == 200 and report["ready"] is True, report
    assert report["shards_not_answering"] == [] and report["storage_nodes_answering"] >= 1
    assert headers["Content-Type"].startswith("application/json")


def test_metrics_are_prometheus_text(served: Served) -> None:
    status, headers, _ = admin_get(served.admin_port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")


def test_each_storage_node_has_its_own_health_and_readiness(served: Served) -> None:
    ports = node_admin_ports(served)
    assert len(ports) == 2
    for port in ports:
        assert admin_get(port, "/health")[0] == 200
        status, _, body = admin_get(port, "/ready")
        report = json.loads(body)
        assert status == 200 and report["ready"] is True and report["free_bytes"] > 0
        # A node has no admin API, whatever token is sent.
        token = {"Authorization": f"Bearer {served.admin_token()}"}
        assert admin_get(port, "/admin/v1/cluster", token)[0] == 401


def test_the_admin_api_needs_the_admin_token(served: Served) -> None:
    path = "/admin/v1/cluster"
    assert admin_get(served.admin_port, path)[0] == 401
    assert admin_get(served.admin_port, path, {"Authorization": "Bearer wrong"})[0] == 401
    s3_signature = (
        f"AWS4-HMAC-SHA256 Credential={served.root.access_key_id}/20261125/us-east-1/s3/"
        "aws4_request, SignedHeaders=host, Signature=" + "0" * 64
    )
    assert admin_get(served.admin_port, path, {"Authorization": s3_signature})[0] == 401
    secret_as_token = {"Authorization": f"Bearer {served.root.secret_access_key}"}
    assert admin_get(served.admin_port, path, secret_as_token)[0] == 401
    status, _, body = admin_get(served.admin_port, "/admin/v1/no-such-thing", bearer(served))
    assert status == 404, body


def test_the_console_sends_strangers_to_its_login_and_logs_the_token_holder_in(
    served: Served,
) -> None:
    status, headers, _ = admin_get(served.admin_port, "/console/")
    assert status == 303 and headers["Location"] == "/console/login"

    status, headers = log_in(served.admin_port, "not the token")
    assert status == 303 and headers["Location"].startswith("/console/login")
    assert "Set-Cookie" not in headers

    status, headers = log_in(served.admin_port, served.admin_token())
    assert status == 303 and headers["Location"] == "/console/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert served.admin_token() not in cookie
    session = cookie.split(";")[0]
    # The session opens the API (the console's pages call it) and the console itself.
    status, _, _ = admin_get(served.admin_port, "/admin/v1/no-such-thing", {"Cookie": session})
    assert status == 404
    status, _, _ = admin_get(served.admin_port, "/console/", {"Cookie": session})
    assert status != 303
    forged = session[:-4] + ("0000" if not session.endswith("0000") else "1111")
    status, headers, _ = admin_get(served.admin_port, "/console/", {"Cookie": forged})
    assert status == 303
