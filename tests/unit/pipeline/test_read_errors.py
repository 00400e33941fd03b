"""How the Arrow readers word what libpq says when a read fails midway (ADBC's batch reader
raises OSError with libpq's text): a dropped connection names the shard, a statement's own
error stays itself."""

from __future__ import annotations

from shoal.metadata import MetadataUnavailable
from shoal.pipeline.io import _arrow_classified

PREFIX = "[libpq] Execution error [PGRES_FATAL_ERROR]: "


def test_a_connection_the_server_ended_names_the_shard() -> None:
    error = OSError(PREFIX + "FATAL:  terminating connection due to administrator command\n")
    found = _arrow_classified(error, "s3")
    assert isinstance(found, MetadataUnavailable)
    assert str(found) == (
        "shard s3 is unreachable: FATAL: terminating connection due to administrator command"
    )


def test_a_lost_link_names_the_shard() -> None:
    error = OSError(PREFIX + "server closed the connection unexpectedly\n\tThis probably means")
    found = _arrow_classified(error, "s0")
    assert str(found) == "shard s0 is unreachable: server closed the connection unexpectedly"


def test_a_statement_error_is_left_as_it_is() -> None:
    error = OSError(PREFIX + "ERROR:  division by zero\n")
    assert _arrow_classified(error, "s0") is error
