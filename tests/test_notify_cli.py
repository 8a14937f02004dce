"""`gpuwatch notify` and `gpuwatch alerts` through the real entry point; the notify service's
socket as another uid; `run --notify` with no daemon; a user daemon that delivers by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alert_endpoints import Hook
from systools import needs_tools, wait_for

from gpuwatch.alerts import admin
from gpuwatch.alerts import subscriptions as subs
from gpuwatch.store import alerts as store_alerts
from gpuwatch.store import open_rw
from gpuwatch.store.alerts import Alert

REPO = Path(__file__).resolve().parent.parent
SECRET = "xoxb-VerySecretToken"


def gw(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", "from gpuwatch.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def user_db() -> Path:
    return Path(os.environ["XDG_DATA_HOME"]) / "gpuwatch" / "gpuwatch.db"


def fire(db: Path, kind: str, uid: int | None, run_id: str | None = None, n: int = 0) -> None:
    conn = open_rw(db)
    try:
        store_alerts.record(
            conn,
            Alert(
                kind=kind,
                incident=f"{kind}-{n}",
                ts_ms=int(time.time() * 1000),
                host="testhost",
                uid=uid,
                run_id=run_id,
                title=f"[{kind} #{n}]",
                body="body",
            ),
        )
    finally:
        conn.close()


def test_add_and_list_never_print_the_secret(hook):
    for url in (
        hook.url(SECRET),
        f"mailto://me:{SECRET}@localhost:2525?to=a@example.com",
        f"slack://{SECRET}/B000/C000",
    ):
        added = gw("notify", "add", url)
        assert added.returncode == 0, added.stderr
        assert SECRET not in added.stdout + added.stderr
    listed = gw("notify", "list")
    assert listed.returncode == 0, listed.stderr
    assert SECRET not in listed.stdout
    lines = listed.stdout.splitlines()
    assert f"json://127.0.0.1:{hook.port}/****" in lines[0]
    assert "mailto://localhost:2525/****" in lines[1]
    assert "slack://****" in lines[2]  # its "host" is a token: masked too
    assert "run.finished,run.failed,run.oom" in lines[0]  # default: my runs' kinds


def test_bad_input_is_one_clear_line(hook):
    for args, message in (
        (("notify", "add", "http//nonsense"), "not a notification URL"),
        (("notify", "add", hook.url(), "--on", "run.nope"), "unknown alert kind 'run.nope'"),
        (("notify", "remove", "42"), "no subscription 42 of yours"),
    ):
        result = gw(*args)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [f"Error: {result.stderr.strip()[7:]}"]
        assert message in result.stderr


def test_test_sends_a_real_message_and_says_when_it_failed(hook):
    result = gw("notify", "test", hook.url(SECRET))
    assert result.returncode == 0, result.stderr
    assert hook.received[0][1]["title"] == "gpuwatch: test message"
    assert SECRET not in result.stdout
    gw("notify", "add", hook.url())
    hook.down = True
    result = gw("notify", "test")
    assert result.returncode == 1 and "FAILED" in result.stdout


def test_remove_then_nothing_is_delivered(hook):
    gw("notify", "add", hook.url())
    assert gw("notify", "remove", "1").returncode == 0
    assert gw("notify", "list").stdout.startswith("no subscriptions")


def test_alerts_lists_what_fired_and_its_delivery_redacted(hook):
    from gpuwatch.alerts.deliver import Deliverer

    gw("notify", "add", hook.url(SECRET))
    fire(user_db(), "run.oom", os.getuid())
    store = Path(os.environ["XDG_DATA_HOME"]) / "gpuwatch" / "notify.db"
    deliverer = Deliverer(store, user_db(), group_s=0)
    try:
        wait_for(lambda: deliverer.deliver_once(), timeout=60)
    finally:
        deliverer.close()
    table = gw("alerts")
    assert table.returncode == 0, table.stderr
    assert "run.oom" in table.stdout and f"-> json://127.0.0.1:{hook.port}/**** sent" in table.stdout
    assert all(len(line) <= 80 for line in table.stdout.splitlines())
    rows = json.loads(gw("alerts", "--format", "json").stdout)
    assert rows[0]["kind"] == "run.oom" and rows[0]["deliveries"][0]["state"] == "sent"
    assert SECRET not in table.stdout + json.dumps(rows)


SERVE = """
import sys
from gpuwatch.cli import main
sys.argv = ["gpuwatch", "notify", "serve", "--user"]
main()
"""

# Another user at the notify socket: imports first (root's Python is 0700), then setuid.
OTHER = """
import os, sys, json
import apprise, gpuwatch.cli, gpuwatch.cli.notify_cmd, gpuwatch.alerts.service
from gpuwatch.alerts import deliver, admin, redact
from gpuwatch.cli import main
store = sys.argv[1]
os.setgid(65534); os.setgroups([]); os.setuid(65534)
try:
    open(store).read()
    print("READ THE STORE")
except PermissionError:
    print("store: permission denied")
for args in (["notify", "list"], ["notify", "remove", "1"], ["notify", "test", "1"],
             ["notify", "add", sys.argv[2], "--run", "rootrun"], ["notify", "add", sys.argv[2]]):
    try:
        main(args, standalone_mode=False)
    except Exception as e:
        print("error:", e)
    sys.stdout.flush()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root to setuid to")
def test_another_uid_cannot_read_remove_or_subscribe_to_the_firsts(tmp_path, hook):
    shared = Path(f"/tmp/gw-notify-{os.getpid()}")
    shared.mkdir(mode=0o755, exist_ok=True)
    os.chmod(shared, 0o755)
    db = shared / "gw.db"
    conn = open_rw(db)
    conn.execute("INSERT INTO runs (run_id, name, uid, started_ms) VALUES ('r1', 'rootrun', 0, 1)")
    conn.close()
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        GPUWATCH_DB=str(db),
        GPUWATCH_NOTIFY_DB=str(shared / "notify.db"),
        GPUWATCH_NOTIFY_SOCKET=str(shared / "n.sock"),
        GPUWATCH_NOTIFY_GROUP_SECONDS="0",
        GPUWATCH_CONFIG=str(shared / "none.toml"),
    )
    proc = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (shared / "n.sock").exists())
        first = gw("notify", "add", hook.url(SECRET), "--run", "rootrun", env=env)
        assert first.returncode == 0, first.stderr
        other = subprocess.run(
            [sys.executable, "-c", OTHER, str(shared / "notify.db"), hook.url("nobody")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        out = other.stdout
        assert "store: permission denied" in out
        assert "no subscriptions" in out and SECRET not in out
        assert out.count("error: no subscription 1 of yours") == 2  # remove and test
        assert "error: run 'rootrun' is another user's" in out
        assert "subscribed 2:" in out  # to its own runs, which is allowed
        # root's alert reaches root's subscription only, never the other uid's.
        fire(db, "run.failed", 0, run_id="r1")
        wait_for(lambda: hook.received, timeout=60)
        time.sleep(1.5)
        assert [m["title"] for _, m in hook.received] == ["[run.failed #0]"]
        assert hook.received and all("nobody" not in t for t in hook.texts())
        listing = gw("notify", "list", env=env).stdout  # root sees both
        assert "uid 0" in listing and "uid 65534" in listing
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", str(shared)])


def test_run_notify_with_no_daemon_delivers_the_runs_alert_and_saved_subscriptions_fire(hook):
    gw("notify", "add", hook.url("saved"))
    # env:NAME keeps the URL off the command line, which every user's `ps` shows.
    result = gw(
        "run",
        "--no-instrument",
        "--name",
        "quick",
        "--notify",
        "env:GW_HOOK",
        "--",
        sys.executable,
        "-c",
        "pass",
        env={"GW_HOOK": hook.url(SECRET)},
    )
    assert result.returncode == 0, result.stderr
    # The rules' run.finished, to both the --notify URL and the saved subscription, once each.
    titles = [m["title"] for _, m in hook.received]
    assert len(titles) == 2 and titles[0] == titles[1] and "quick" in titles[0] and "finished" in titles[0], (
        titles
    )
    missing = gw("run", "--notify", "env:GW_UNSET", "--", "true")
    assert missing.returncode == 1 and "GW_UNSET is not set" in missing.stderr
    assert SECRET not in result.stdout + result.stderr
    listed = gw("notify", "list").stdout.splitlines()
    assert len(listed) == 1  # the --notify subscription is gone once the run's end went out


def test_run_notify_end_to_end_a_failing_run_is_delivered_as_run_failed(hook):
    result = gw(
        "run", "--no-instrument", "--notify", hook.url(), "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert result.returncode == 3
    kinds = [m["title"] for _, m in hook.received]
    assert len(kinds) == 1 and "fail" in kinds[0].lower()


USER_DAEMON = """
import sys
sys.path.insert(0, {tests!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon.main import run_daemon
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "system": False, "notify_group_seconds": 0}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=1)))
""".format(tests=str(REPO / "tests"))


def test_a_user_daemon_delivers_by_itself(tmp_path, hook):
    gw("notify", "add", hook.url(), "--on", "run.*,gpu.idle_held")
    db, sock = tmp_path / "gw.db", tmp_path / "d.sock"
    proc = subprocess.Popen(
        [sys.executable, "-c", USER_DAEMON, str(db), str(sock)],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: sock.exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()[1]
        fire(db, "gpu.idle_held", os.getuid())
        wait_for(lambda: hook.received, timeout=60)
        assert hook.received[0][1]["title"] == "[gpu.idle_held #0]"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_admin_file_readable_by_others_is_refused_and_a_private_one_is_read(tmp_path):
    path = tmp_path / "notify.toml"
    path.write_text(
        '[[subscription]]\nurl = "json://127.0.0.1:1/x"\non = ["gpu.*"]\n'
        '[[subscription]]\nurl = "ntfy://ntfy.sh/topic"\n'
    )
    os.chmod(path, 0o644)
    with pytest.raises(subs.SubscriptionError, match="readable by other users"):
        admin.load(path)
    os.chmod(path, 0o600)
    entries = admin.load(path)
    assert entries[0][1] == subs.parse_kinds("gpu.*")
    assert entries[1][1] == subs.ADMIN_KINDS
    path.write_text('[[subscription]]\nurl = "json://h/x"\non = ["run.failed"]\n')
    with pytest.raises(subs.SubscriptionError, match="unknown alert kind 'run.failed'"):
        admin.load(path)  # an admin-wide subscription never gets a user's runs


@needs_tools("systemd-analyze")
def test_notify_unit_is_verified_hardened_and_the_daemon_keeps_its_fence(tmp_path):
    # the installed command, whose path goes into ExecStart= (as tests/test_systemd.py runs it)
    result = subprocess.run(
        [str(Path(sys.executable).with_name("gpuwatch")), "install-service", "--prefix", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "etc/systemd/system/gpuwatch-notify.service"
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0 and "Unknown" not in verify.stderr, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = float(
        security.stdout.split("Overall exposure level for gpuwatch-notify.service:")[1].split()[0]
    )
    assert exposure <= 2.0, security.stdout[-2000:]
    lines = unit.read_text().splitlines()
    assert "ReadOnlyPaths=/var/lib/gpuwatch" in lines and "DynamicUser=yes" in lines
    assert not any(line.startswith("IPAddressDeny") for line in lines)  # its job is the network
    daemon_unit = (tmp_path / "etc/systemd/system/gpuwatch.service").read_text().splitlines()
    assert "IPAddressDeny=any" in daemon_unit


def test_the_notify_service_answers_garbage_with_one_line_and_keeps_serving(tmp_path):
    import socket

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GPUWATCH_DB": str(tmp_path / "gw.db"),
        "GPUWATCH_NOTIFY_DB": str(tmp_path / "notify.db"),
        "GPUWATCH_NOTIFY_SOCKET": str(tmp_path / "n.sock"),
    }
    proc = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "n.sock").exists())
        for line in (
            b"\xff\xfe not json\n",
            b'{"op": "drop tables"}\n',
            b"[1, 2]\n",
            b'{"op": "add", "url": 5, "on": ["x"]}\n',
            b'{"op": "add", "uid": 0, "url": "json://h/x"}\n',
            b'{"op": "deliveries", "alert_ids": ["a"]}\n',
        ):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(30)
                s.connect(str(tmp_path / "n.sock"))
                s.sendall(line)
                reply = json.loads(s.makefile().readline())
            assert set(reply) == {"error"} and "\n" not in reply["error"], (line, reply)
        assert gw("notify", "list", env=env).stdout.startswith("no subscriptions")  # still serving
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
