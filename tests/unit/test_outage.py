"""What a failure of a shard means for its caller (shoal/metadata/outage.py)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors
from psycopg_pool import PoolTimeout

from shoal.metadata import CommitUnknown, MetadataUnavailable, VnodeMoved
from shoal.metadata.outage import classified, connection_failed

LOST = psycopg.OperationalError("consuming input failed: server closed the connection")


@pytest.mark.parametrize(
    "exc",
    [
        LOST,
        PoolTimeout("couldn't get a connection after 1.00 sec"),
        errors.AdminShutdown("terminating connection due to administrator command"),
        errors.CannotConnectNow("the database system is starting up"),
        errors.ConnectionFailure("connection failure"),
    ],
)
def test_a_failed_connection_is_unavailable_or_unknown_by_how_far_the_call_got(
    exc: Exception,
) -> None:
    assert connection_failed(exc)
    refused = classified(exc, "pg-a", may_have_committed=False)
    unknown = classified(exc, "pg-a", may_have_committed=True)
    assert isinstance(refused, MetadataUnavailable) and "pg-a" in str(refused)
    assert isinstance(unknown, CommitUnknown) and not isinstance(unknown, MetadataUnavailable)


@pytest.mark.parametrize(
    "exc",
    [
        errors.CheckViolation("no partition of relation"),
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.DeadlockDetected("deadlock detected"),
        ValueError("not a database error"),
    ],
)
def test_an_error_the_server_sent_about_a_statement_is_left_as_it_is(exc: Exception) -> None:
    assert not connection_failed(exc)
    assert classified(exc, "pg-a", may_have_committed=True) is exc


def test_an_error_already_classified_stays_what_it_is() -> None:
    refused = MetadataUnavailable("shard pg-a is unreachable")
    assert classified(refused, "pg-a", may_have_committed=True) is refused


@pytest.mark.parametrize("may_have_committed", [False, True])
def test_a_statement_on_a_vnode_the_shard_no_longer_holds_is_vnode_moved(
    may_have_committed: bool,
) -> None:
    gone = errors.UndefinedTable('relation "manta_bucket_3.manta_bucket_object" does not exist')
    moved = classified(gone, "pg-a", may_have_committed=may_have_committed)
    assert isinstance(moved, VnodeMoved) and isinstance(moved, MetadataUnavailable)
    no_schema = errors.InvalidSchemaName('schema "manta_bucket_3" does not exist')
    assert isinstance(classified(no_schema, "pg-a", may_have_committed=False), VnodeMoved)
    other = errors.UndefinedTable('relation "shoal.ring" does not exist')
    assert classified(other, "pg-a", may_have_committed=False) is other
