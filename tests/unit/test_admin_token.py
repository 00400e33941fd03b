"""The admin token: bearer checks, console sessions and the token file."""

from __future__ import annotations

import stat
from pathlib import Path

from shoal.admin.auth import SESSION_SECONDS, AdminToken, load_or_create_token


def test_the_token_file_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "admin.token"
    token = load_or_create_token(path)
    assert len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(path) == token


def test_a_bearer_token_must_match_exactly() -> None:
    token = AdminToken("s3cret-token")
    assert token.accepts_bearer("Bearer s3cret-token")
    assert token.accepts_bearer("bearer s3cret-token")
    assert not token.accepts_bearer("Bearer s3cret-toke")
    assert not token.accepts_bearer("Basic s3cret-token")
    assert not token.accepts_bearer("Bearer ")
    assert not token.accepts_bearer(None)


def test_a_session_lasts_until_it_expires_and_cannot_be_forged() -> None:
    token = AdminToken("s3cret-token")
    session = token.new_session(now=1_000_000.0)
    assert token.accepts_session(session, now=1_000_000.0 + SESSION_SECONDS - 1)
    assert not token.accepts_session(session, now=1_000_000.0 + SESSION_SECONDS + 1)
    expires, _, mac = session.partition(".")
    later = str(int(expires) + 3600)
    assert not token.accepts_session(f"{later}.{mac}", now=1_000_000.0)
    assert not token.accepts_session("garbage", now=1_000_000.0)
    assert not AdminToken("another-token").accepts_session(session, now=1_000_000.0)
