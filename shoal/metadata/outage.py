"""What a failure of a shard means for the call that met it, decided here and nowhere else.

A statement can fail because PostgreSQL refused it (a constraint, a lock time-out): the server
answered, and the error says what happened. Or the connection itself failed: the server is
down, restarting, refusing connections, or the link broke. Then what happened depends on how
far the call got:

- nothing of a write can have reached a commit (no connection was obtained, the write was
  never sent, the COMMIT of its transaction never sent, or the call only read): the caller
  gets MetadataUnavailable, and may clean up after itself and try again;
- a write, or the COMMIT of a transaction, was sent and its answer lost: the write may have
  committed. The caller gets CommitUnknown, and must keep whatever the write names.

A statement that names a vnode's schema which the shard does not hold (undefined_table,
invalid_schema_name on `manta_bucket_<vnode>`) met a vnode that moved away: VnodeMoved.
PostgreSQL resolves names again when it re-plans a prepared statement after the schema was
renamed, so prepared statements are refused too.

Other errors that are not a connection's failure are returned unchanged.
"""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

from shoal.metadata.errors import CommitUnknown, MetadataUnavailable, VnodeMoved

# SQLSTATEs the server sends as it drops a connection: admin_shutdown (a fast or immediate
# stop), crash_shutdown (another backend crashed), cannot_connect_now (starting up or
# recovering). Class 08 is "connection exception".
_GOING_AWAY = {"57P01", "57P02", "57P03"}
# undefined_table, invalid_schema_name: what naming a vnode's schema that moved away meets.
_VNODE_MISSING = {"42P01", "3F000"}
# How every vnode's schema is named (ring.vnode_schema), as it appears in PostgreSQL's errors.
_VNODE_SCHEMA = "manta_bucket_"


def connection_failed(exc: BaseException) -> bool:
    """True when `exc` says the connection to a shard failed, not that a statement did."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    return lost_connection(exc.sqlstate)


def lost_connection(sqlstate: str | None) -> bool:
    """True when a connection error with this SQLSTATE means the connection failed. No
    SQLSTATE: the failure is the client's own (connect refused, connection lost, the
    connection closed), not an error the server sent about a statement."""
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in _GOING_AWAY


def vnode_gone(exc: BaseException) -> bool:
    """True when `exc` (psycopg's, or ADBC's for the pipeline's readers) says a statement
    named a vnode schema that the shard does not hold."""
    return getattr(exc, "sqlstate", None) in _VNODE_MISSING and _VNODE_SCHEMA in str(exc)


def classified(exc: Exception, shard: str, *, may_have_committed: bool) -> Exception:
    """What to raise for `exc`, met on `shard`: `exc` itself unless the connection failed
    or the vnode moved away."""
    if isinstance(exc, MetadataUnavailable | CommitUnknown):
        return exc
    if vnode_gone(exc):
        return VnodeMoved(f"shard {shard} no longer holds the vnode: {_first_line(exc)}")
    if not connection_failed(exc):
        return exc
    reason = _first_line(exc)
    if may_have_committed:
        return CommitUnknown(
            f"shard {shard}: the connection broke before a write's answer came: {reason}"
        )
    return MetadataUnavailable(f"shard {shard} is unreachable: {reason}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
