"""Prepared statements run on a pooled connection's libpq handle, below psycopg's cursor.

Why: a point read (one object's row by key) cost ~125 us of the gateway's CPU through an
async cursor and ~95 us this way (/tmp probes of session 9, bench/RESULTS.md), on every GET,
HEAD, PUT and DELETE. The cursor's work per call is Python: converting the query, its
prepared-statement bookkeeping, result and row objects. Here each statement is prepared once
per connection, under its own name, and then only its parameters travel; psycopg still does
what it does best: adapting values both ways (its C Transformer, with the connection's
adapters, hstore among them), waiting on the socket, and turning an error result into the
same exception classes (psycopg.errors) that its cursor raises.

A connection is used by one coroutine at a time (it is borrowed from the pool), so no lock.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, generators
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
        # Per (statement, result format): a Transformer whose loaders suit its columns.
        # Choosing a loader per column is a third of the cost of loading a row.
        self.loaders: dict[tuple[bytes, int], Transformer] = {}

    def new_name(self) -> bytes:
        self.made += 1
        return b"shoal_%d" % self.made


_prepared_on: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], _Prepared] = (
    weakref.WeakKeyDictionary()
)
# Per statement text: the names of its result columns.
_columns: dict[bytes, tuple[str, ...]] = {}
_AUTO = (PyFormat.AUTO,)


# Given a result's column names, what makes one row from its values.
RowMaker = Callable[[tuple[str, ...]], Callable[[Sequence[Any]], Any]]


def dict_rows(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], Row]:
    return lambda values: dict(zip(columns, values, strict=True))


@dataclass(frozen=True)
class Parameters:
    """A statement's values as they travel: bytes (or None for NULL), their types and
    formats (binary or text)."""

    dumped: Sequence[bytes | None]
    types: tuple[int, ...]
    formats: Sequence[Format]


async def fetch(
    conn: psycopg.AsyncConnection[Any],
    statement: bytes,
    values: Sequence[Any],
    *,
    binary: bool = False,
    rows: RowMaker = dict_rows,
) -> list[Any]:
    """Run `statement` (placeholders $1, $2, ...) with `values` and return its rows, made by
    `rows` (dicts by default; none for a statement that returns no rows). `binary` results
    load faster (timestamps, UUIDs, bytea, hstore): the statements of GET and HEAD and of
    listings use them; others keep text, which any column type has."""
    parameters = dumped(conn, values)
    result_format = Format.BINARY if binary else Format.TEXT
    try:
        result = await _execute(conn, statement, parameters, result_format)
    except errors.InvalidSqlStatementName:
        # DEALLOCATE ALL or DISCARD ALL ran on this connection: psycopg sends the former
        # after a ROLLBACK, DROP or ALTER on a connection where it prepared statements of
        # its own. Ours are gone with them: prepare again.
        forget_prepared(conn)
        result = await _execute(conn, statement, parameters, result_format)
    return loaded_rows(conn, result, statement, rows)


def dumped(conn: psycopg.AsyncConnection[Any], values: Sequence[Any]) -> Parameters:
    adapt = _state(conn).dumper
    data = adapt.dump_sequence(values, _AUTO * len(values))
    return Parameters(data, adapt.types or (), adapt.formats or ())


def loaded_rows(
    conn: psycopg.AsyncConnection[Any], result: Any, statement: bytes, rows: RowMaker
) -> list[Any]:
    """A successful result's rows, made by `rows` (none for a command without rows)."""
    if result.status == ExecStatus.COMMAND_OK:
        return []
    loaders = _state(conn).loaders
    key = (statement, result.fformat(0) if result.nfields else 0)
    adapt = loaders.get(key)
    if adapt is None:
        adapt = loaders[key] = Transformer.from_context(conn)
        adapt.set_pgresult(result)
    else:
        adapt.set_pgresult(result, set_loaders=False)
    columns = _columns.get(statement)
    if columns is None:
        columns = _columns[statement] = tuple(
            (result.fname(i) or b"").decode() for i in range(result.nfields)
        )
    return adapt.load_rows(0, result.ntuples, rows(columns))


async def _execute(
    conn: psycopg.AsyncConnection[Any],
    statement: bytes,
    parameters: Parameters,
    result_format: Format,
) -> Any:
    name = await prepared_name(conn, statement, parameters)
    conn.pgconn.send_query_prepared(
        name, parameters.dumped, param_formats=parameters.formats, result_format=result_format
    )
    return await _result(conn)


async def prepared_name(
    conn: psycopg.AsyncConnection[Any], statement: bytes, parameters: Parameters
) -> bytes:
    """The statement's name on this connection, preparing it on first use. Keyed by the
    parameters' types too: a NULL in one call and a value in the next differ."""
    prepared = _state(conn)
    key = (statement, parameters.types)
    name = prepared.names.get(key)
    if name is None:
        name = prepared.new_name()
        conn.pgconn.send_prepare(name, statement, param_types=parameters.types)
        await _result(conn)
        prepared.names[key] = name
    return name


def _state(conn: psycopg.AsyncConnection[Any]) -> _Prepared:
    prepared = _prepared_on.get(conn)
    if prepared is None:
        prepared = _prepared_on[conn] = _Prepared(conn)
    return prepared


async def _result(conn: psycopg.AsyncConnection[Any]) -> Any:
    """The result of the command just sent; an error result raised as psycopg raises it."""
    # The connection's own wait: it sleeps on the socket, and a cancelled task cancels the
    # statement in the server and drains its answer, so the connection stays usable.
    results = await conn.wait(generators.execute(conn.pgconn))
    return checked(conn, results[-1])


def checked(conn: psycopg.AsyncConnection[Any], result: Any) -> Any:
    """`result` if it succeeded; an error result raised as psycopg raises it."""
    if result.status in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK):
        return result
    raise errors.error_from_result(result, encoding=conn.info.encoding)


def forget_prepared(conn: psycopg.AsyncConnection[Any]) -> None:
    """Forget what `conn` prepared (the server dropped it: DEALLOCATE ALL, DISCARD ALL)."""
    prepared = _prepared_on.get(conn)
    if prepared is not None:
        prepared.names.clear()
        prepared.loaders.clear()
