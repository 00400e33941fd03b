"""Node request tokens: what they bind, how long they live, and that a node accepts one once."""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shoal.storage.auth import (
    CLOCK_SKEW_SECONDS,
    TOKEN_LIFETIME_SECONDS,
    InvalidToken,
    ReplayCache,
    ReplayCacheFull,
    Signed,
    canonical_query,
    sign,
    verify,
)

SECRET = b"s" * 32
DELETE = Signed.request("127.0.0.1:9100", "POST", "/blocks/delete", body=b'{"names": ["a"]}')


def nonce_of(token: str) -> str:
    return token.split(" ", 1)[1].split(":")[1]


def test_a_token_opens_its_request() -> None:
    verify(SECRET, DELETE, sign(SECRET, DELETE))


@pytest.mark.parametrize(
    "change",
    [
        {"host": "127.0.0.1:9101"},
        {"method": "DELETE"},
        {"path": "/blocks/other"},
        {"query": "after=x"},
        {"content": Signed.request("h", "POST", "/", body=b'{"names": ["b"]}').content},
        {"range": "bytes=0-9"},
    ],
    ids=["host", "method", "path", "query", "body", "range"],
)
def test_a_token_opens_no_other_request(change: dict[str, str]) -> None:
    with pytest.raises(InvalidToken, match="bad signature"):
        verify(SECRET, dataclasses.replace(DELETE, **change), sign(SECRET, DELETE))


def _with_field(token: str, index: int, value: str) -> str:
    scheme, fields = token.split(" ", 1)
    parts = fields.split(":")
    parts[index] = value
    return f"{scheme} {':'.join(parts)}"


@pytest.mark.parametrize(
    ("index", "change"),
    [
        (0, lambda expires: str(int(expires) + 1)),  # a longer life
        (0, lambda expires: str(int(expires) - 1)),
        (1, lambda nonce: ("0" if nonce[0] != "0" else "1") + nonce[1:]),  # a fresh nonce
        (2, lambda mac: ("0" if mac[0] != "0" else "1") + mac[1:]),
        (2, lambda mac: mac.upper()),
    ],
    ids=["later-expiry", "earlier-expiry", "nonce", "mac", "mac-spelling"],
)
def test_a_token_whose_fields_are_changed_opens_nothing(
    index: int, change: Callable[[str], str]
) -> None:
    token = sign(SECRET, DELETE)
    original = token.split(" ", 1)[1].split(":")[index]
    with pytest.raises(InvalidToken, match="bad signature"):
        verify(SECRET, DELETE, _with_field(token, index, change(original)))


def test_a_replayed_token_is_refused_even_for_the_request_it_was_made_for(
    tmp_path: Path,
) -> None:
    replays = ReplayCache(tmp_path / "replay.lock", slots=1024)
    token = sign(SECRET, DELETE)
    verify(SECRET, DELETE, token, replays)
    # Turned into another request, it fails on its signature before the nonce is looked at.
    other = dataclasses.replace(DELETE, path="/blocks/other")
    with pytest.raises(InvalidToken, match="bad signature"):
        verify(SECRET, other, token, replays)
    with pytest.raises(InvalidToken, match="already used"):
        verify(SECRET, DELETE, token, replays)


def test_a_refused_token_is_not_remembered(tmp_path: Path) -> None:
    """A token refused for its signature uses up no nonce: the genuine request still passes."""
    replays = ReplayCache(tmp_path / "replay.lock", slots=1024)
    token = sign(SECRET, DELETE)
    with pytest.raises(InvalidToken):
        verify(SECRET, dataclasses.replace(DELETE, method="GET"), token, replays)
    verify(SECRET, DELETE, token, replays)


def test_a_token_lives_until_its_expiry_second() -> None:
    now = 1_000_000.0
    token = sign(SECRET, DELETE, now=now)
    verify(SECRET, DELETE, token, now=now + TOKEN_LIFETIME_SECONDS)
    with pytest.raises(InvalidToken, match="expired"):
        verify(SECRET, DELETE, token, now=now + TOKEN_LIFETIME_SECONDS + 0.001)


def test_a_block_put_binds_the_checksum_and_the_length() -> None:
    put = Signed.request("h:1", "PUT", "/blocks/x", body=b"abc", checksum="0" * 32)
    token = sign(SECRET, put)
    verify(SECRET, put, token)
    for other in (
        Signed.request("h:1", "PUT", "/blocks/x", body=b"abc", checksum="1" * 32),
        Signed.request("h:1", "PUT", "/blocks/x", body=b"abcd", checksum="0" * 32),
    ):
        with pytest.raises(InvalidToken, match="bad signature"):
            verify(SECRET, other, token)


def test_queries_are_signed_in_one_spelling() -> None:
    assert canonical_query("limit=5&after=") == canonical_query("after=&limit=5")
    assert canonical_query("limit=5") != canonical_query("limit=6")


def test_another_secret_signs_nothing() -> None:
    with pytest.raises(InvalidToken, match="bad signature"):
        verify(SECRET, DELETE, sign(b"t" * 32, DELETE))


def test_tokens_expire_and_are_not_minted_far_ahead() -> None:
    now = time.time()
    with pytest.raises(InvalidToken, match="expired"):
        verify(SECRET, DELETE, sign(SECRET, DELETE, now=now - TOKEN_LIFETIME_SECONDS - 1), now=now)
    ahead = now + CLOCK_SKEW_SECONDS + 1
    with pytest.raises(InvalidToken, match="too far ahead"):
        verify(SECRET, DELETE, sign(SECRET, DELETE, now=ahead), now=now)
    # A signer's clock a little ahead is fine.
    verify(SECRET, DELETE, sign(SECRET, DELETE, now=now + CLOCK_SKEW_SECONDS - 1), now=now)


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer x", "Shoal-Token 1:2", "Shoal-Token x:y:z", "Shoal-Token 9:NONCE:00"],
)
def test_malformed_tokens_are_refused(header: str | None) -> None:
    with pytest.raises(InvalidToken):
        verify(SECRET, DELETE, header)


def test_a_node_accepts_a_token_once(tmp_path: Path) -> None:
    replays = ReplayCache(tmp_path / "replay.lock", slots=1024)
    token = sign(SECRET, DELETE)
    verify(SECRET, DELETE, token, replays)
    with pytest.raises(InvalidToken, match="already used"):
        verify(SECRET, DELETE, token, replays)
    verify(SECRET, DELETE, sign(SECRET, DELETE), replays)  # a new token for the same request


def test_the_cache_forgets_expired_tokens_and_refuses_when_full(tmp_path: Path) -> None:
    replays = ReplayCache(tmp_path / "replay.lock", slots=ReplayCache.BUCKET)  # one bucket
    now = 1_000_000.0
    nonces = [f"{i:016x}{0:016x}" for i in range(1, ReplayCache.BUCKET + 1)]
    for nonce in nonces:
        assert replays.first_use(nonce, int(now) + 10, now)
    assert not replays.first_use(nonces[0], int(now) + 10, now)
    with pytest.raises(ReplayCacheFull):
        replays.first_use(f"{999:016x}{0:016x}", int(now) + 10, now)
    later = now + 11  # every token above has expired: their slots are free again
    assert replays.first_use(f"{999:016x}{0:016x}", int(later) + 10, later)
    assert replays.first_use(nonces[0], int(later) + 10, later)


def _use_in_another_process(
    replays: ReplayCache, nonce: str, answer: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    now = time.time()
    answer.put(replays.first_use(nonce, int(now) + 10, now))


def test_the_processes_of_a_node_share_what_they_accepted(tmp_path: Path) -> None:
    replays = ReplayCache(tmp_path / "replay.lock", slots=1024)
    spawn = multiprocessing.get_context("spawn")
    answer = spawn.Queue()
    seen_here, seen_there = "a" * 32, "b" * 32
    now = time.time()
    assert replays.first_use(seen_here, int(now) + 10, now)
    for nonce, expected in ((seen_here, False), (seen_there, True)):
        process = spawn.Process(target=_use_in_another_process, args=(replays, nonce, answer))
        process.start()
        assert answer.get(timeout=30) is expected
        process.join(timeout=30)
    assert not replays.first_use(seen_there, int(now) + 10, now)
