"""The web console in headless Chromium, against the session's `shoal serve`: a stranger
gets the login form, a wrong token is told so, and the token holder sees every page, each
captured as a screenshot under the test's tmp_path, with what the cluster holds on it.

Needs a `chromium` binary (Debian's `chromium` package); skipped without one."""

from __future__ import annotations

import asyncio
import http.client
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from shoal.admin.console import FILES
from tests.fixtures.browser import Page, chromium
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served

PAGES = ("overview", "nodes", "buckets", "usage", "runs")
# A screenshot of a page with its text drawn is several KiB; a blank one is far smaller.
NON_TRIVIAL_PNG_BYTES = 5000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_console_answers_forbid_framing_inline_scripts_and_caching(served: Served) -> None:
    for path in ("/console/login", "/console/static/console.js"):
        status, headers, _ = get(served, path)
        assert status == 200, path
        policy = headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Cache-Control"] == "no-store"
    assert get(served, "/console/static/console.js")[1]["Content-Type"].startswith(
        "text/javascript"
    )
    assert "wrong token" in get(served, "/console/login?failed=1")[2]
    assert "wrong token" not in get(served, "/console/login")[2]
    for path in ("/console/static/nothing.js", "/console/static/..%2Fconsole.py"):
        assert get(served, path)[0] == 404, path


def test_an_installed_package_carries_every_console_file() -> None:
    """pyproject's package data names each file of the console (no file left behind)."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["shoal.admin"]
    for file in FILES.iterdir():
        relative = f"{FILES.name}/{file.name}"
        assert any(Path(relative).match(pattern) for pattern in patterns), relative


def test_the_console_script_never_writes_html() -> None:
    """Strings from the API (bucket and account names are user input) reach the page as
    text: the script has no way to write markup."""
    script = (FILES / "console.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


@pytest.mark.slow
def test_a_stranger_gets_the_login_form_and_a_wrong_token_is_refused(
    served: Served, tmp_path: Path
) -> None:
    async def scenario(page: Page) -> None:
        for path in ("/console/", "/console/#buckets"):
            ended_at = await page.navigate(served.admin + path)
            # (a redirect keeps the fragment of the page asked for)
            assert ended_at.split("#")[0] == served.admin + "/console/login", path
        await page.wait_for_selector("form input[name=token]")
        assert "wrong token" not in await page.text("body")
        shot(await page.screenshot(tmp_path / "login.png"))

        ended_at = await page.submit_form("form", {"token": "not the token"})
        assert ended_at == served.admin + "/console/login?failed=1"
        await page.wait_for_text("wrong token")
        assert page.exceptions == []

    run_in_browser(tmp_path, scenario)


@pytest.mark.slow
def test_the_token_holder_sees_every_page_of_the_console(
    served: Served, s3: Any, tmp_path: Path
) -> None:
    bucket = unique("console")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="shown/in the console", Body=b"x" * 1000)
    others = served.client(served.other)
    other_bucket = unique("console-other")
    others.create_bucket(Bucket=other_bucket)

    async def scenario(page: Page) -> None:
        await page.navigate(served.admin + "/console/login")
        ended_at = await page.submit_form("form", {"token": served.admin_token()})
        assert ended_at == served.admin + "/console/"
        assert served.admin_token() not in ended_at

        await show(page, "overview")
        assert await page.text("#overview-ready .body p") == "ready"
        await page.wait_for_text("of 2 alive", "#overview-nodes")
        await page.wait_for_text("reachable", "#overview-shards")

        await show(page, "nodes")
        await page.wait_for_text("node0", "#nodes-panel")
        assert await page.evaluate("document.querySelectorAll('#nodes-panel .bar').length") == 2

        await show(page, "buckets")
        assert bucket in await account_text(page, "root")
        assert other_bucket in await account_text(page, "other")
        assert other_bucket not in await account_text(page, "root")

        await show(page, "usage")
        await show(page, "runs")
        await page.wait_for_text("Garbage collection")

        for name in PAGES:
            await show(page, name)
            shot(await page.screenshot(tmp_path / f"{name}.png"))
        assert page.exceptions == []
        refused = [line for line in page.console if "Content Security Policy" in line]
        assert refused == []

        # Logging out ends the session: the console sends the browser to its login again.
        ended_at = await page.submit_form("form.logout", {})
        assert ended_at == served.admin + "/console/login"
        assert await page.navigate(served.admin + "/console/") == served.admin + "/console/login"

    run_in_browser(tmp_path, scenario)


async def show(page: Page, name: str) -> None:
    """Open a page of the console with its link, once its data has arrived, and check that
    no panel of it says it could not load."""
    await page.evaluate(f"document.querySelector('nav a[data-page={name}]').click()")
    await page.wait_for(f"document.body.dataset.shown === {json.dumps(name)}", f"the {name} page")
    failed = await page.text(f"#page-{name} .error")
    assert failed == "", f"the {name} page: {failed}"


async def account_text(page: Page, account: str) -> str:
    """The text of the Buckets page's section of `account` ("" if it has none)."""
    return str(
        await page.evaluate(
            "[...document.querySelectorAll('#buckets-panel section.account')]"
            f".filter(s => s.querySelector('h2').textContent === {json.dumps(account)})"
            ".map(s => s.innerText).join('')"
        )
    )


def get(served: Served, path: str) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", served.admin_port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def shot(path: Path) -> None:
    picture = path.read_bytes()
    assert picture.startswith(PNG_SIGNATURE), path
    assert len(picture) > NON_TRIVIAL_PNG_BYTES, (path, len(picture))


def run_in_browser(tmp_path: Path, scenario: Any) -> None:
    async def main() -> None:
        async with chromium(tmp_path) as page:
            await scenario(page)

    asyncio.run(main())
