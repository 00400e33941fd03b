"""A web page uploads to Shoal from another origin: headless Chromium loads a page served on
another port of 127.0.0.1, which PUTs a file with a presigned URL (after the browser's CORS
preflight) and reads it back with `fetch()`; the page's DOM shows what it read.

Needs a `chromium` binary (Debian's `chromium` package); skipped without one."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.serve import Served

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)
BROWSER_SECONDS = 60
CONTENT = "uploaded by a web page"

PAGE = """<!DOCTYPE html>
<html><body><pre id="result">pending</pre>
<script>
const put = %(put)s, get = %(get)s;
async function run() {
  const stored = await fetch(put, {method: "PUT", body: %(content)s,
                                   headers: {"Content-Type": "text/plain"}});
  if (!stored.ok) throw new Error("PUT " + stored.status);
  const read = await fetch(get);
  if (!read.ok) throw new Error("GET " + read.status);
  return "read:" + (await read.text()) + "|etag:" + read.headers.get("ETag");
}
run().then(
  text => { document.getElementById("result").textContent = text; },
  error => { document.getElementById("result").textContent = "failed:" + error; });
</script></body></html>
"""


@contextlib.contextmanager
def page_server(page: str) -> Iterator[str]:
    """An http.server on 127.0.0.1 serving `page` at /: another origin than the gateway's."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def dom_after_scripts(url: str, profile: Path) -> str:
    """The DOM of `url` once its scripts have run (virtual time waits for their fetches)."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",  # the tests may run as root
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
        "--dump-dom",
        url,
    ]
    # Its own process group, so that a browser that hangs goes with all its helper processes.
    browser = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        dom, _ = browser.communicate(timeout=BROWSER_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.communicate()
        pytest.fail(f"chromium did not finish within {BROWSER_SECONDS} s")
    return dom


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian's chromium package)")
def test_a_web_page_uploads_with_a_presigned_put_and_reads_it_back(
    served: Served, s3: Any, bucket: str, tmp_path: Path
) -> None:
    key = "from/the browser.txt"
    put = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key, "ContentType": "text/plain"}
    )
    get = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
    page = PAGE % {"put": json.dumps(put), "get": json.dumps(get), "content": json.dumps(CONTENT)}
    with page_server(page) as origin:
        s3.put_bucket_cors(
            Bucket=bucket,
            CORSConfiguration={
                "CORSRules": [
                    {
                        "AllowedOrigins": [origin],
                        "AllowedMethods": ["PUT", "GET"],
                        "AllowedHeaders": ["*"],
                        "ExposeHeaders": ["ETag"],
                    }
                ]
            },
        )
        dom = dom_after_scripts(origin + "/", tmp_path / "profile")
    etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    assert f"read:{CONTENT}|etag:{etag}" in dom.replace("&quot;", '"'), dom
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == CONTENT.encode()
