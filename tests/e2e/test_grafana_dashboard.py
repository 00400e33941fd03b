"""The shipped Grafana dashboard (docs/grafana/shoal.json) fits the metrics Shoal exposes:
every metric it charts is one a running `shoal serve` or storage node exposes, and, where a
`prometheus` binary is installed (Debian's `prometheus` package), a real Prometheus scraping
Shoal evaluates every panel's query without an error, and the core panels show data."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shoal.telemetry import FLUSH_SECONDS
from tests.fixtures.admin import admin_get, node_admin_ports
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Keys, Served

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "shoal.json"
PROMETHEUS = shutil.which("prometheus")
PROMETHEUS_SECONDS = 60
PROMETHEUS_START_SECONDS = 30
# Grafana's variables, as an operator's Prometheus job names and Grafana would fill them.
VARIABLES = {
    "$__rate_interval": "15s",
    "$gateway_job": "shoal-gateway",
    "$node_job": "shoal-node",
}
# Panels whose queries must return data right after some S3 traffic.
MUST_SHOW_DATA = (
    "Gateway ready",
    "Storage nodes ready",
    "Requests by operation",
    "Requests in flight",
    "Disk free",
    "Blocks held",
    "Pool connections by shard",
)


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables filled in) for every target."""
    found = []
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            found.append((panel["title"], expr))
    return found


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus() -> None:
    board = dashboard()
    assert board["title"] == "Shoal" and board["uid"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert "$" not in target["expr"].replace("$__rate_interval", "").replace(
                "$gateway_job", ""
            ).replace("$node_job", ""), target["expr"]


def test_every_charted_metric_is_exposed(served: Served) -> None:
    some_traffic(served)
    exposed = set()
    for port in [served.admin_port, *node_admin_ports(served)]:
        status, _, body = admin_get(port, "/metrics")
        assert status == 200
        exposed |= set(re.findall(r"^# TYPE (\S+) ", body.decode(), re.MULTILINE))
    charted = set()
    for _, expr in queries():
        for name in re.findall(r"\b(shoal_[a-z0-9_]+)", expr):
            charted.add(re.sub(r"_(bucket|sum|count|total)$", "", name))
    exposed_bases = {re.sub(r"_total$", "", name) for name in exposed}
    assert charted - exposed_bases == set()


def some_traffic(served: Served) -> None:
    """A PUT, a GET, a LIST and a refused signature: every request metric gets a sample (in
    multiprocess mode a metric with no sample yet is not exposed at all)."""
    s3 = served.client()
    bucket = unique("dash")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 100_000)
    s3.get_object(Bucket=bucket, Key="k")["Body"].read()
    s3.list_objects_v2(Bucket=bucket)
    stranger = Keys(served.root.access_key_id, "not-the-secret")
    with pytest.raises(ClientError):
        served.client(stranger).head_bucket(Bucket=bucket)
    time.sleep(FLUSH_SECONDS + 0.5)  # the request counts reach the shared files each second


@contextlib.contextmanager
def prometheus(tmp_path: Path, gateway: list[int], nodes: list[int]) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1 scraping the gateway's and nodes' admin ports every
    second, on a port the kernel picks; its URL once it listens."""
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "shoal-gateway",
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in gateway]}],
                    },
                    {
                        "job_name": "shoal-node",
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in nodes]}],
                    },
                ],
            }
        )
    )
    with open(tmp_path / "prometheus.log", "w") as log:  # the child keeps its own copy
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                "--web.listen-address=127.0.0.1:0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield f"http://{listening_address(process, tmp_path / 'prometheus.log')}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def listening_address(process: subprocess.Popen[bytes], log: Path) -> str:
    """The host:port Prometheus's log says it listens on (its web server's line)."""
    deadline = time.monotonic() + PROMETHEUS_START_SECONDS
    while time.monotonic() < deadline:
        said = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', log.read_text())
        if said:
            return said.group(1)
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    raise TimeoutError(f"Prometheus did not say where it listens: see {log}")


def query(url: str, expr: str) -> dict[str, Any]:
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as error:  # a query Prometheus refuses: 400 with a reason
        return json.loads(error.read())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="needs a prometheus binary (Debian's package)")
def test_a_real_prometheus_evaluates_every_panel(served: Served, tmp_path: Path) -> None:
    s3 = served.client()
    bucket = unique("dash")
    s3.create_bucket(Bucket=bucket)
    with prometheus(tmp_path, [served.admin_port], node_admin_ports(served)) as url:
        deadline = time.monotonic() + PROMETHEUS_SECONDS
        empty: list[str] = []
        while time.monotonic() < deadline:
            for n in range(5):  # traffic while Prometheus scrapes, for rate()
                s3.put_object(Bucket=bucket, Key=f"k{n}", Body=b"x" * 2_000_000)
                s3.get_object(Bucket=bucket, Key=f"k{n}")["Body"].read()
            results = [(title, query(url, expr)) for title, expr in queries()]
            failed = [(t, r.get("error")) for t, r in results if r.get("status") != "success"]
            assert failed == []
            empty = [t for t, r in results if t in MUST_SHOW_DATA and not r["data"]["result"]]
            if not empty:
                break
            time.sleep(1)
        assert empty == []
