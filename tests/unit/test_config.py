"""Configuration: defaults that depend on the machine, and the documented file."""

import re
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest

from shoal.config import (
    ConfigError,
    default_gateway_workers,
    parse_config,
    redact_dsn,
    usable_cores,
)


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_the_gateway_takes_half_the_cores_by_default(cores: int, workers: int) -> None:
    assert default_gateway_workers(cores) == workers


def test_a_configuration_without_s3_workers_gets_the_default_and_one_with_them_keeps_them(
    tmp_path: Path,
) -> None:
    assert parse_config({}, tmp_path).s3.workers == default_gateway_workers(usable_cores())
    assert parse_config({"s3": {"workers": 3}}, tmp_path).s3.workers == 3
    with pytest.raises(ConfigError, match="workers"):
        parse_config({"s3": {"workers": 0}}, tmp_path)


def test_the_request_head_deadline_is_20_seconds_unless_set(tmp_path: Path) -> None:
    assert parse_config({}, tmp_path).s3.request_head_seconds == 20
    assert parse_config({"s3": {"request_head_seconds": 5}}, tmp_path).s3.request_head_seconds == 5
    with pytest.raises(ConfigError, match="request_head_seconds"):
        parse_config({"s3": {"request_head_seconds": 0}}, tmp_path)


def test_signature_v2_accepts_presigned_urls_unless_set_and_only_its_three_values(
    tmp_path: Path,
) -> None:
    assert parse_config({}, tmp_path).s3.signature_v2 == "presigned"
    for setting in ("presigned", "all", "off"):
        assert parse_config({"s3": {"signature_v2": setting}}, tmp_path).s3.signature_v2 == setting
    for wrong in ("header", "", True, ["all"]):
        with pytest.raises(ConfigError, match=r"\[s3\] signature_v2"):
            parse_config({"s3": {"signature_v2": wrong}}, tmp_path)


def test_node_tls_settings_are_paths_and_a_certificate_comes_with_its_key(
    tmp_path: Path,
) -> None:
    storage = parse_config({}, tmp_path).storage
    assert (storage.tls_cert, storage.tls_key, storage.tls_ca) == (None, None, None)
    given = {"tls_cert": "node.crt", "tls_key": "node.key", "tls_ca": "ca.pem"}
    storage = parse_config({"storage": given}, tmp_path).storage
    assert storage.tls_cert == tmp_path.absolute() / "node.crt"
    assert storage.tls_ca == tmp_path.absolute() / "ca.pem"
    with pytest.raises(ConfigError, match="go together"):
        parse_config({"storage": {"tls_cert": "node.crt"}}, tmp_path)
    with pytest.raises(ConfigError, match="must be a path"):
        parse_config({"storage": {"tls_ca": 3}}, tmp_path)


def test_nodes_write_through_the_page_cache_unless_direct_writes_is_set(tmp_path: Path) -> None:
    assert parse_config({}, tmp_path).storage.direct_writes is False
    given = {"storage": {"direct_writes": True}}
    assert parse_config(given, tmp_path).storage.direct_writes is True
    with pytest.raises(ConfigError, match="direct_writes must be true or false"):
        parse_config({"storage": {"direct_writes": "yes"}}, tmp_path)


def test_the_admin_listener_defaults_to_loopback_9001_and_a_token_in_the_data_dir(
    tmp_path: Path,
) -> None:
    config = parse_config({"data_dir": "d"}, base=tmp_path)
    assert (config.admin.host, config.admin.port) == ("127.0.0.1", 9001)
    assert config.admin_token_file == tmp_path / "d" / "admin.token"
    custom = parse_config(
        {"admin": {"host": "0.0.0.0", "port": 9101, "token_file": "secrets/admin"}}, base=tmp_path
    )
    assert (custom.admin.host, custom.admin.port) == ("0.0.0.0", 9101)
    assert custom.admin_token_file == tmp_path / "secrets" / "admin"
    with pytest.raises(ConfigError, match=r"\[admin\] port"):
        parse_config({"admin": {"port": 0}}, base=tmp_path)
    with pytest.raises(ConfigError, match="unknown setting"):
        parse_config({"admin": {"listen": "x"}}, base=tmp_path)


def test_the_log_format_is_text_unless_set_to_json_and_nothing_else(tmp_path: Path) -> None:
    assert parse_config({}, tmp_path).log.format == "text"
    assert parse_config({"log": {"format": "json"}}, tmp_path).log.format == "json"
    for wrong in ("xml", 1, ["json"]):
        with pytest.raises(ConfigError, match=r"\[log\] format"):
            parse_config({"log": {"format": wrong}}, tmp_path)
    with pytest.raises(ConfigError, match=r"\[log\]: level"):
        parse_config({"log": {"level": "debug"}}, tmp_path)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "postgresql://shoal:pa%40ss@/shard0?host=%2Frun%2Fpg&port=5432",
            "postgresql://shoal:***@/shard0?host=%2Frun%2Fpg&port=5432",
        ),
        (
            "postgres://u:pw@h1:5432,h2/db?password=pw2&sslmode=require",
            "postgres://u:***@h1:5432,h2/db?password=***&sslmode=require",
        ),
        ("postgresql://u@h/db?sslpassword=pw", "postgresql://u@h/db?sslpassword=***"),
        ("postgresql://h/db", "postgresql://h/db"),
        ("host=h user=u password=pw dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h  password = 'p w\\' d'  dbname=d", "host=h password=*** dbname=d"),
        ("host=h PASSWORD=pw", "host=h PASSWORD=***"),
        ("host=h sslpassword=pw", "host=h sslpassword=***"),
        ("not a dsn pw", "(a connection string Shoal cannot read, not shown)"),
    ],
)
def test_a_shown_dsn_has_no_password(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown


def test_a_shard_shows_its_dsn_without_its_password_and_its_repr_has_none(
    tmp_path: Path,
) -> None:
    shard = {"name": "s0", "dsn": "postgresql://shoal:topsecret@db/shoal"}
    config = parse_config({"metadata": {"shards": [shard]}}, tmp_path)
    (parsed,) = config.metadata.shards
    assert parsed.dsn == shard["dsn"]  # the whole DSN, to connect with
    assert parsed.shown_dsn == "postgresql://shoal:***@db/shoal"
    assert "topsecret" not in repr(parsed) and "topsecret" not in repr(config)


def test_a_dsn_libpq_cannot_read_is_refused_without_quoting_it(tmp_path: Path) -> None:
    shard = {"name": "s0", "dsn": "host=db password=top secret"}
    with pytest.raises(ConfigError) as refused:
        parse_config({"metadata": {"shards": [shard]}}, tmp_path)
    assert "s0" in str(refused.value) and "secret" not in str(refused.value)


def test_the_documented_configuration_file_is_one_shoal_reads(tmp_path: Path) -> None:
    """docs/configuration.md's example, every section of it, parses as it says."""
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    found = re.search(r"## A configuration file.*?```toml\n(.*?)```", text, re.S)
    assert found is not None
    config = parse_config(tomllib.loads(found.group(1)), base=tmp_path)
    assert [s.name for s in config.metadata.shards] == ["pg_a", "pg_b"]
    assert config.gc.interval == timedelta(minutes=15) and config.gc.leeway == timedelta(days=1)
    assert (config.admin.host, config.admin.port) == ("127.0.0.1", 9001)
    assert config.log.format == "text" and config.s3.workers == 2
