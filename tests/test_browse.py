"""`gpuwatch browse` in Debian's Chromium (driven by Playwright): a canned query opens with its
chart, writes are refused, a request without the printed token gets 403; the metadata says
what each table and column holds, with units, from the schema."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from systools import needs_tools
from test_analysis import fill_two_runs
from test_tui_web import launch_chromium

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
URL_LINE = re.compile(r"open (http://\S+)/\?token=(\S+)")
ROOT = Path(__file__).parents[1]


def start_browse(db: Path) -> tuple[subprocess.Popen, str, str]:
    """`gpuwatch browse --port 0`: the process, its base URL and its token."""
    server = subprocess.Popen(
        [GPUWATCH, "browse", "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            raise AssertionError(f"gpuwatch browse exited: {server.wait()}")
        match = URL_LINE.search(line)
        if match:
            return server, match.group(1), match.group(2)
    server.kill()
    raise AssertionError("gpuwatch browse printed no URL in 60 s")


@pytest.fixture(scope="module")
def browsed(tmp_path_factory):
    db = tmp_path_factory.mktemp("browse") / "gpuwatch.db"
    fill_two_runs(db)
    server, base, token = start_browse(db)
    try:
        yield db, base, token
    finally:
        server.terminate()
        server.wait(10)


def fetch(url: str, method: str = "GET", cookie: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers={"Cookie": cookie} if cookie else {})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_without_the_token_every_request_is_refused(browsed):
    _, base, token = browsed
    for path in ("/", "/gpuwatch/runs", "/gpuwatch.json?sql=select+1", "/-/static-plugins/datasette_vega/"):
        assert fetch(base + path)[0] == 403, path
    assert fetch(base + "/?token=" + token[:-1] + ("x" if token[-1] != "x" else "y"))[0] == 403
    assert fetch(base + "/gpuwatch/runs", cookie=f"gpuwatch_token_{base.rsplit(':', 1)[1]}=wrong")[0] == 403
    status, _ = fetch(base + "/?token=" + token)
    assert status == 302  # to the same page without the token in its URL, the cookie set


def test_writes_are_refused_and_nothing_changes(browsed):
    db, base, token = browsed
    cookie = f"gpuwatch_token_{base.rsplit(':', 1)[1]}={token}"
    status, body = fetch(base + "/gpuwatch.json?sql=" + urllib.parse.quote("DELETE FROM runs"), cookie=cookie)
    assert status == 400 and "must be a SELECT" in body
    assert fetch(base + "/gpuwatch/runs", method="POST", cookie=cookie)[0] == 405
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    status, body = fetch(base + "/gpuwatch/runs.json?_shape=array", cookie=cookie)
    assert status == 200 and {r["run_id"] for r in json.loads(body)} == {"aaaa1111", "bbbb2222"}


def test_tables_and_columns_are_described_with_units(browsed):
    _, base, token = browsed
    cookie = f"gpuwatch_token_{base.rsplit(':', 1)[1]}={token}"
    status, body = fetch(base + "/-/metadata.json", cookie=cookie)
    tables = json.loads(body)["databases"]["gpuwatch"]["tables"]
    assert tables["runs"]["description"].startswith("One row per run")
    assert tables["runs"]["columns"]["status"] == "running | finished | failed | oom | killed | lost"
    assert tables["runs"]["columns"]["started_ms"] == "ms since the Unix epoch (UTC)"
    assert tables["steps"]["columns"]["tokens_per_s"] == "tokens per second"
    assert tables["gpu_samples"]["columns"]["power_mw"] == "milliwatts"
    assert (
        tables["gpu_samples_1h"]["columns"]["mem_used_bytes_max"]
        == "maximum of mem_used_bytes over the period; bytes"
    )
    assert tables["runs_fts"] == {"hidden": True}


def test_every_table_in_the_docs_is_described_and_the_docs_queries_are_canned():
    from gpuwatch.browse.metadata import QUERIES, TABLES

    readme = (ROOT / "docs" / "database.md").read_text()  # the schema's page of the manual
    rows = readme.split("| table | one row per |")[1].split("\n\n")[0].splitlines()[2:]
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    listed |= {
        f"host_samples{tier}" for tier in ("_15m", "_1h") if "host_samples` (+ `_15m`, `_1h`)" in readme
    }
    listed = {t for t in listed if not t.endswith("_fts")} - {"_15m", "_1h"}  # FTS indexes stay hidden
    assert listed and listed <= set(TABLES), listed - set(TABLES)
    worked = readme.split("Worked queries")[1].split("```sql")[1].split("```")[0]
    statements = [s.strip() + ";" for s in worked.split(";") if s.strip()]
    canned = [q["sql"] for q in QUERIES.values()]
    assert statements and all(s in canned for s in statements)


# Pixels of the chart's canvas drawn in colour (axes, grid and labels are grey or black).
COLOURED_PIXELS_JS = """(c) => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] > 0 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 60) n++; }
  return n; }"""


def open_chart(page, url: str, base: str) -> int:
    """Open `url` (nothing may leave the machine: the plotting plugin's JS must be local) and
    wait until its chart is drawn; the count of its coloured pixels."""
    page.route(
        "**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort()
    )
    page.goto(url)
    canvas = page.locator(".vega-embed canvas.marks")
    canvas.wait_for(timeout=30_000)
    page.wait_for_function(
        f"() => ({COLOURED_PIXELS_JS})(document.querySelector('.vega-embed canvas.marks')) > 50",
        timeout=30_000,
    )
    return canvas.evaluate(COLOURED_PIXELS_JS)


@needs_tools("chromium")
def test_a_canned_query_opens_with_its_chart_in_chromium(browsed):
    from playwright.sync_api import sync_playwright

    _, base, token = browsed
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            assert (
                open_chart(page, f"{base}/gpuwatch/tokens_per_s_over_time?run=baseline&token={token}", base)
                > 50
            )
            assert "#g.mark=line" in page.url and "g.y_column=tokens_per_s" in page.url
            assert page.locator("table.rows-and-columns tbody tr").count() == 10  # the run's steps
            # Another run through the form: the chart settings travel with it.
            page.fill("input[name=run]", "bbbb2222")
            page.click("input[type=submit][value='Run SQL'], button:has-text('Run SQL')")
            page.wait_for_url("**run=bbbb2222**")
            assert "#g.mark=line" in page.url
            page.wait_for_function(
                "() => document.querySelectorAll('table.rows-and-columns tbody tr').length == 5"
            )
        finally:
            browser.close()


def test_every_canned_query_runs(browsed):
    from gpuwatch.browse.metadata import QUERIES

    _, base, token = browsed
    cookie = f"gpuwatch_token_{base.rsplit(':', 1)[1]}={token}"
    results = {}
    for name in QUERIES:
        status, body = fetch(f"{base}/gpuwatch/{name}.json?run=baseline&days=100000", cookie=cookie)
        results[name] = (status, json.loads(body).get("error"))
    assert results == {name: (200, None) for name in QUERIES}
    _, body = fetch(f"{base}/gpuwatch/ooms_per_week.json?_shape=array", cookie=cookie)
    assert [r["ooms"] for r in json.loads(body)] == [1]  # run B: status oom and a postmortem, once
    _, body = fetch(
        f"{base}/gpuwatch/gpu_hours_per_user_per_day.json?_shape=array&days=100000", cookie=cookie
    )
    hours = {(r["user"], r["gpu_hours"]) for r in json.loads(body)}
    assert hours == {("alice", round((100 + 60) / 3600, 2))}  # both runs started the same day, 1 GPU each
