"""`gpuwatch tui --web` in a real headless Chromium (Debian's, driven by Playwright): the overview
shows the GPUs, keys reach the app, and a request without the printed token is refused."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from systools import needs_tools
from test_tui_terminal import populated_db

from gpuwatch.store import Writer

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
URL_LINE = re.compile(r"open (http://\S+/\?token=(\S+))")

# The page's terminal (xterm.js) draws on a canvas: to read what it shows, the test's copy of
# textual-serve's script also hands its terminal object to the page.
TERMINAL_NEW = re.compile(r"this\.terminal=new (\w+)\.Terminal\(")
SCREEN_JS = """() => { const t = window.gpuwatchTerminal; if (!t) return "";
  const lines = []; for (let i = 0; i < t.rows; i++) { const l = t.buffer.active.getLine(i);
  lines.push(l ? l.translateToString(true) : ""); } return lines.join("\\n"); }"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(db: Path) -> tuple[subprocess.Popen, str]:
    """`gpuwatch tui --web` on a free loopback port: the server process and the URL it printed."""
    server = subprocess.Popen(
        [GPUWATCH, "tui", "--web", str(free_port()), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            raise AssertionError(f"gpuwatch tui --web exited: {server.wait()}")
        match = URL_LINE.search(line)
        if match:
            return server, match.group(1)
    server.kill()
    raise AssertionError("gpuwatch tui --web printed no URL in 30 s")


@pytest.fixture
def served(tmp_path):
    """A database like a daemon's, served by `gpuwatch tui --web`; yields (url with token, token)."""
    server, url = start_web(populated_db(tmp_path / "gw.db"))
    try:
        yield url, URL_LINE.search("open " + url).group(2)
    finally:
        server.terminate()
        server.wait(10)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_requests_without_the_token_are_refused(served):
    url, token = served
    base = url.split("?")[0]
    assert status_of(url) == 200
    assert status_of(base) == 403
    wrong = token[:-1] + ("x" if token[-1] != "x" else "y")  # one character off
    assert status_of(base + "?token=" + wrong) == 403
    assert status_of(base + "static/js/textual.js") == 403
    assert status_of(base + "ws") == 403  # the websocket that would start an app process


def open_tui_page(browser, url: str):
    """A page on `url` whose terminal the test can read (wait_for_screen); nothing it asks for
    leaves the machine (the page asks for a web font)."""
    origin = url.split("/?")[0]
    patched = []

    def route(route):
        if not route.request.url.startswith(origin):
            route.abort()
        elif route.request.url.endswith("/textual.js"):
            response = route.fetch()
            body, n = TERMINAL_NEW.subn(
                r"this.terminal=window.gpuwatchTerminal=new \1.Terminal(", response.text()
            )
            patched.append(n)
            route.fulfill(response=response, body=body)
        else:
            route.continue_()

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.route("**/*", route)
    page.goto(url)
    page.patched = patched
    return page


def wait_for_screen(page, *texts: str, timeout_s: float = 30, until=lambda screen: True) -> str:
    """The terminal's text once it shows all of `texts` and `until(text)` holds. Polled: xterm.js
    draws a frame in pieces, so one text on screen does not mean the rest of the frame is."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = page.evaluate(SCREEN_JS)
        if all(t in screen for t in texts) and until(screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{texts} not in the browser (textual.js patched {page.patched} times):\n{screen}"
            )
        page.wait_for_timeout(100)


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.mark.slow
@needs_tools("chromium")
def test_overview_in_chromium_and_keys_work(served):
    from playwright.sync_api import sync_playwright

    url, _ = served
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = open_tui_page(browser, url)
            # Every GPU, one line each, and the processes under them.
            wait_for_screen(
                page,
                "GPU processes: 50",
                "live",
                "power cap",
                "train.py --shard",
                until=lambda screen: screen.count("NVIDIA H100 80GB HBM3") == 8,
            )
            page.locator("#terminal").click()
            page.keyboard.press("r")
            wait_for_screen(page, "Runs: 20")
            page.keyboard.press("o")
            wait_for_screen(page, "GPU processes: 50")
        finally:
            browser.close()


@pytest.mark.parametrize(
    "address, refusal",
    [
        ("0.0.0.0:8765", "0.0.0.0 is not a loopback address"),
        ("8765x", "expected [HOST:]PORT"),
    ],
)
def test_a_reachable_or_bad_address_is_refused(tmp_path, address, refusal):
    Writer(tmp_path / "gw.db").close()
    result = subprocess.run(
        [GPUWATCH, "tui", "--web", address, "--db", str(tmp_path / "gw.db")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and refusal in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_each_tab_starts_the_tui_module_with_every_option_the_server_gives_it():
    import shlex

    from gpuwatch.tui.__main__ import parser
    from gpuwatch.tui.web import tui_command

    argv = shlex.split(
        tui_command("/data/gw.db", 2.5, "ana", "http://prom:9090", "no daemon: history starts now")
    )
    assert argv[:3] == [sys.executable, "-m", "gpuwatch.tui"]  # the TUI itself, not the CLI
    args = parser().parse_args(argv[3:])
    assert (args.db, args.refresh, args.user, args.prometheus, args.notice) == (
        "/data/gw.db",
        2.5,
        "ana",
        "http://prom:9090",
        "no daemon: history starts now",
    )


def test_the_tui_module_says_in_one_line_when_the_database_is_missing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch.tui", "--db", str(tmp_path / "none.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == f"gpuwatch tui: {tmp_path / 'none.db'}: no such database " + (
        "(is the daemon running, or has a run been tracked?)\n"
    )
