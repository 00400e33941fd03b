"""Prepared statements run on a pooled connection's libpq handle, below psycopg's cursor.

Why: a point read (one object's row by key) runs on every GET, HEAD, PUT and DELETE, and
through an async cursor about a quarter of its CPU in the gateway is the cursor's own Python
work per call: converting the query, its prepared-statement bookkeeping, result and row
objects (docs/decisions.md, "Prepared statements below psycopg's cursor";
`bench/gateway_instructions.py get` counts a GET's instructions). Here each statement is
prepared once per connection, under its own name, and then only its parameters travel;
psycopg still does what it does best: adapting values both ways (its C Transformer, with
the connection's adapters, hstore among them), waiting on the socket, and turning an error
result into the same exception classes (psycopg.errors) that its cursor raises.

A connection is used by one coroutine at a time (it is borrowed from the pool), so no lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import abc, errors, generators
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus, Format

Row = dict[str, Any]


class _Prepared:
    """What one connection has prepared: (statement text, parameter types) -> name, and the
    Transformers that adapt values for it. Names are never reused on a connection, even
    after `names` was emptied: a statement whose PREPARE was interrupted, or one that
    outlived a forgotten DEALLOCATE, may still hold its name in the server."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.names: dict[Any, bytes] = {}
        self.made = 0
        self.dumper = Transformer.from_context(conn)
        # Per prepared name: its result's column names, and a Transformer whose loaders suit
        # its columns (choosing a loader per column was a third of the cost of loading a
        # row). By name, not by text: the same text prepared for other parameter types
        # may return other column types (`SELECT $1`).
        self.loaders: dict[bytes, tuple[tuple[str, ...], abc.Transformer]] = {}

    def new_name(self) -> bytes:
        self.made += 1
        return b"shoal_%d" % self.made


# The attribute of a connection that holds its _Prepared. On the connection itself, not in a
# module-level WeakKeyDictionary: the Transformers refer to their connection, so such a
# dictionary's values kept its keys alive, and every connection the pool retired leaked.
_STATE = "_shoal_prepared"
_AUTO = (PyFormat.AUTO,)


# What runs a psycopg generator on a connection to its end: AsyncConnection.wait, or a
# SocketWatch's wait.
Waiter = Callable[[abc.PQGen[Any]], Awaitable[Any]]

# Given a result's column names, what makes one row from its values.
RowMaker = Callable[[tuple[str, ...]], Callable[[Sequence[Any]], Any]]


def dict_rows(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], Row]:
    return lambda values: dict(zip(columns, values, strict=True))


@dataclass(frozen=True)
class Parameters:
    """A statement's values as they travel: bytes (or None for NULL), their types and
    formats (binary or text)."""

    dumped: Sequence[abc.Buffer | None]
    types: tuple[int, ...]
    formats: Sequence[Format]


async def fetch(
    conn: psycopg.AsyncConnection[Any],
    statement: bytes,
    values: Sequence[Any],
    *,
    rows: RowMaker = dict_rows,
) -> list[Any]:
    """Run `statement` (placeholders $1, $2, ...) with `values` and return its rows, made by
    `rows` (dicts by default; none for a statement that returns no rows). Results come in
    binary: timestamps, UUIDs, bytea and hstore load faster from it than from text
    (docs/decisions.md, "Binary results, loaders chosen once")."""
    parameters = dumped(conn, values)
    try:
        name, result = await _execute(conn, statement, parameters)
    except errors.InvalidSqlStatementName:
        # DEALLOCATE ALL or DISCARD ALL ran on this connection: psycopg sends the former
        # after a ROLLBACK, DROP or ALTER on a connection where it prepared statements of
        # its own. Ours are gone with them: prepare again.
        forget_prepared(conn)
        name, result = await _execute(conn, statement, parameters)
    return loaded_rows(conn, result, name, rows)


def dumped(conn: psycopg.AsyncConnection[Any], values: Sequence[Any]) -> Parameters:
    adapt = _state(conn).dumper
    data = adapt.dump_sequence(values, _AUTO * len(values))
    return Parameters(data, adapt.types or (), adapt.formats or ())


def loaded_rows(
    conn: psycopg.AsyncConnection[Any], result: Any, name: bytes, rows: RowMaker = dict_rows
) -> list[Any]:
    """The rows of a successful result of the statement prepared as `name`, made by `rows`
    (none for a command without rows)."""
    if result.status == ExecStatus.COMMAND_OK:
        return []
    loaders = _state(conn).loaders
    known = loaders.get(name)
    if known is None:
        columns = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
        adapt = Transformer.from_context(conn)
        adapt.set_pgresult(result)
        loaders[name] = (columns, adapt)
    else:
        columns, adapt = known
        adapt.set_pgresult(result, set_loaders=False)
    return adapt.load_rows(0, result.ntuples, rows(columns))


async def _execute(
    conn: psycopg.AsyncConnection[Any], statement: bytes, parameters: Parameters
) -> tuple[bytes, Any]:
    """The statement's prepared name and its result."""
    name = await prepared_name(conn, statement, parameters)
    send_prepared(conn, name, parameters)
    return name, await _result(conn)


def send_prepared(conn: psycopg.AsyncConnection[Any], name: bytes, parameters: Parameters) -> None:
    """Send the prepared statement `name` with its parameters, asking for binary results."""
    conn.pgconn.send_query_prepared(
        name, parameters.dumped, param_formats=parameters.formats, result_format=Format.BINARY
    )


async def prepared_name(
    conn: psycopg.AsyncConnection[Any],
    statement: bytes,
    parameters: Parameters,
    wait: Waiter | None = None,
) -> bytes:
    """The statement's name on this connection, preparing it on first use (waiting with
    `wait`, the connection's own wait by default). Keyed by the parameters' types too: a
    NULL in one call and a value in the next differ."""
    prepared = _state(conn)
    key = (statement, parameters.types)
    name = prepared.names.get(key)
    if name is None:
        name = prepared.new_name()
        conn.pgconn.send_prepare(name, statement, param_types=parameters.types)
        await _result(conn, wait)
        prepared.names[key] = name
    return name


def _state(conn: psycopg.AsyncConnection[Any]) -> _Prepared:
    prepared: _Prepared | None = getattr(conn, _STATE, None)
    if prepared is None:
        prepared = _Prepared(conn)
        setattr(conn, _STATE, prepared)
    return prepared


async def _result(conn: psycopg.AsyncConnection[Any], wait: Waiter | None = None) -> Any:
    """The result of the command just sent; an error result raised as psycopg raises it."""
    # The connection's own wait by default: it sleeps on the socket, and a cancelled task
    # cancels the statement in the server and drains its answer, so the connection stays
    # usable. A batcher's connection is watched by the batcher (socket_watch.py).
    results = await (wait or conn.wait)(generators.execute(conn.pgconn))
    return checked(conn, results[-1])


def checked(conn: psycopg.AsyncConnection[Any], result: Any) -> Any:
    """`result` if it succeeded; an error result raised as psycopg raises it."""
    if result.status in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK):
        return result
    raise errors.error_from_result(result, encoding=conn.info.encoding)


def forget_prepared(conn: psycopg.AsyncConnection[Any]) -> None:
    """Forget what `conn` prepared (the server dropped it: DEALLOCATE ALL, DISCARD ALL)."""
    prepared: _Prepared | None = getattr(conn, _STATE, None)
    if prepared is not None:
        prepared.names.clear()
        prepared.loaders.clear()
