"""Objects that hold a secret keep it out of their repr, which a log line or an error
message may show."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from shoal.config import ShardConfig
from shoal.credentials import KeyPair
from shoal.metadata import Account
from shoal.storage.client import ClientSettings


def test_no_secret_in_the_repr_of_what_holds_one() -> None:
    account = Account(id=uuid.uuid4(), name="root", created=datetime.now(UTC))
    holders = [
        ShardConfig(name="s0", dsn="postgresql://shoal:topsecret@db/shoal"),
        KeyPair(account, "SHKEY", "topsecret"),
        ClientSettings(b"topsecret"),
    ]
    for holder in holders:
        assert "topsecret" not in repr(holder), holder
