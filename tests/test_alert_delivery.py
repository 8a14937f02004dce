"""Alert delivery through a real apprise to loopback endpoints: every kind exactly once,
grouping, an outage, a killed deliverer, redaction, and the private store's permissions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alert_endpoints import Hook, Mailbox
from systools import wait_for

from gpuwatch.alerts import KINDS
from gpuwatch.alerts import subscriptions as subs
from gpuwatch.alerts.deliver import Deliverer, backoff_s
from gpuwatch.store import alerts as store_alerts
from gpuwatch.store import open_rw
from gpuwatch.store import subscriptions as stored_subs
from gpuwatch.store.alerts import Alert

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def shared_db(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    yield tmp_path / "gw.db", conn
    conn.close()


def fire(conn, kind: str, n: int = 0, uid: int | None = 0, run_id: str | None = None) -> int:
    """Store one alert row as the rules would; its id."""
    alert = Alert(
        kind=kind,
        incident=f"{kind}-{n}-{time.time_ns()}",
        ts_ms=int(time.time() * 1000),
        host="testhost",
        uid=uid,
        run_id=run_id,
        title=f"[{kind} #{n}] title",
        body=f"body of {kind} #{n}; more: gpuwatch alerts",
    )
    alert_id = store_alerts.record(conn, alert)
    assert alert_id
    return alert_id


def test_every_kind_reaches_a_json_hook_exactly_once(tmp_path, shared_db, hook):
    db, conn = shared_db
    store = stored_subs.open_store(tmp_path / "notify.db")
    stored_subs.add(store, 0, hook.url("mine"), KINDS)  # root's own: every kind with its uid
    stored_subs.sync_admin(store, [(hook.url("admin"), subs.ADMIN_KINDS)], 0)  # GPUs and the host
    store.close()
    deliverer = Deliverer(tmp_path / "notify.db", db, group_s=0)
    deliverer.start(interval_s=0.1)
    try:
        mine = (
            "run.finished",
            "run.failed",
            "run.oom",
            "run.stalled",
            "run.recovered",
            "run.slow",
            "run.lost",
            "gpu.idle_held",
            "gpus.free",
        )
        for kind in KINDS:
            fire(conn, kind, uid=0 if kind in mine else None)
        wait_for(lambda: all(hook.count(f"[{k} #0]") for k in KINDS), timeout=60)
        time.sleep(1.5)  # several more passes: nothing is sent twice
        counts = {k: hook.count(f"[{k} #0]") for k in KINDS}
        # gpu.idle_held goes to its user and to the admins; everything else once.
        assert counts == {k: 2 if k == "gpu.idle_held" else 1 for k in KINDS}
    finally:
        deliverer.stop()


def test_mailto_delivers_an_email_to_a_loopback_smtp_server(tmp_path, shared_db):
    db, conn = shared_db
    box = Mailbox()
    try:
        store = stored_subs.open_store(tmp_path / "notify.db")
        stored_subs.add(store, 0, box.url(), ("run.oom",))
        store.close()
        fire(conn, "run.oom", uid=0)
        deliverer = Deliverer(tmp_path / "notify.db", db, group_s=0)
        try:
            wait_for(lambda: deliverer.deliver_once() or box.messages, timeout=60)
        finally:
            deliverer.close()
        assert len(box.messages) == 1
        assert box.messages[0]["Subject"] == "[run.oom #0] title"
        assert box.messages[0]["To"] == "owner@example.com"
    finally:
        box.close()


def test_alerts_close_together_go_out_as_one_message_per_window(tmp_path, shared_db, hook):
    db, conn = shared_db
    store = stored_subs.open_store(tmp_path / "notify.db")
    stored_subs.add(store, 0, hook.url(), subs.DEFAULT_KINDS)
    store.close()
    deliverer = Deliverer(tmp_path / "notify.db", db, group_s=3.0)
    try:
        fire(conn, "run.failed", 1)
        deliverer.deliver_once()
        assert len(hook.received) == 1  # the first one at once
        for n in range(2, 7):
            fire(conn, "run.failed", n)
        deliverer.deliver_once()
        assert len(hook.received) == 1  # held: a message went out less than 3 s ago
        wait_for(lambda: deliverer.deliver_once() or len(hook.received) == 2, timeout=30)
        grouped = hook.received[1][1]
        assert grouped["title"] == "gpuwatch: 5 alerts on testhost"
        assert all(f"[run.failed #{n}]" in grouped["message"] for n in range(2, 7))
    finally:
        deliverer.close()


@pytest.mark.slow
def test_an_endpoint_down_then_back_gets_every_alert_once_and_no_url_is_logged(
    tmp_path, shared_db, hook, caplog, monkeypatch
):
    from gpuwatch.alerts import deliver

    # The backoff's own steps are checked below; here its waits run at a quarter of the time.
    monkeypatch.setattr(deliver, "backoff_s", lambda attempts: backoff_s(attempts) / 4)
    db, conn = shared_db
    store = stored_subs.open_store(tmp_path / "notify.db")
    stored_subs.add(store, 0, hook.url("tok-in-url"), subs.DEFAULT_KINDS)
    store.close()
    hook.down = True
    deliverer = Deliverer(tmp_path / "notify.db", db, group_s=0)
    deliverer.start(interval_s=0.1)
    try:
        for n in range(5):
            fire(conn, "run.failed", n)
            time.sleep(0.3)
        # a shortened outage: the first alert tried at 0, 0.25 and 0.75 s (backing off), the others too
        wait_for(lambda: hook.refused_count("[run.failed #0]") >= 3, timeout=60)
        assert hook.refused >= 2 and not hook.received
        back = time.monotonic()
        hook.down = False
        wait_for(lambda: all(hook.count(f"[run.failed #{n}]") for n in range(5)), timeout=90)
        assert hook.received[0][0] - back <= 60 + 5  # within a minute of its return
        time.sleep(1)
        assert [hook.count(f"[run.failed #{n}]") for n in range(5)] == [1] * 5
    finally:
        deliverer.stop()
    assert "tok-in-url" not in caplog.text
    assert "127.0.0.1" in caplog.text  # the warning names the endpoint, redacted


def test_backoff_doubles_and_is_capped_at_a_minute():
    assert [backoff_s(n) for n in (1, 2, 3, 4, 6, 7, 20)] == [1, 2, 4, 8, 32, 60, 60]


SERVE = """
import sys
from gpuwatch.cli import main
sys.argv = ["gpuwatch", "notify", "serve", "--user"]
main()
"""


def serve(tmp_path: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        GPUWATCH_DB=str(tmp_path / "gw.db"),
        GPUWATCH_NOTIFY_DB=str(tmp_path / "notify.db"),
        GPUWATCH_NOTIFY_SOCKET=str(tmp_path / "n.sock"),
        GPUWATCH_NOTIFY_GROUP_SECONDS="0",
    )
    (tmp_path / "n.sock").unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: (tmp_path / "n.sock").exists() or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def test_a_deliverer_killed_with_alerts_pending_sends_each_once_after_restart(tmp_path, shared_db, hook):
    db, conn = shared_db
    store = stored_subs.open_store(tmp_path / "notify.db")
    stored_subs.add(store, 0, hook.url(), subs.DEFAULT_KINDS)
    store.close()
    proc = serve(tmp_path)
    try:
        fire(conn, "run.finished", 0)
        wait_for(lambda: hook.count("[run.finished #0]"), timeout=60)  # delivered before the kill
        hook.down = True
        for n in range(1, 4):
            fire(conn, "run.failed", n)
        wait_for(lambda: hook.refused >= 1, timeout=60)
        proc.send_signal(signal.SIGKILL)  # a crash, with three alerts pending
        proc.wait(timeout=30)
        for n in range(4, 6):
            fire(conn, "run.oom", n)  # and two while it is away
        hook.down = False
        proc = serve(tmp_path)
        wait_for(
            lambda: all(
                hook.count(t)
                for t in (
                    "[run.failed #1]",
                    "[run.failed #2]",
                    "[run.failed #3]",
                    "[run.oom #4]",
                    "[run.oom #5]",
                )
            ),
            timeout=90,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc = serve(tmp_path)  # a clean restart repeats nothing either
        time.sleep(2)
        assert [
            hook.count(t)
            for t in (
                "[run.finished #0]",
                "[run.failed #1]",
                "[run.failed #2]",
                "[run.failed #3]",
                "[run.oom #4]",
                "[run.oom #5]",
            )
        ] == [1] * 6
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_private_store_is_mode_600_and_a_readable_one_is_refused(tmp_path):
    conn = stored_subs.open_store(tmp_path / "dir" / "notify.db")
    stored_subs.add(conn, 0, "json://127.0.0.1:1/x/secret", subs.DEFAULT_KINDS)
    conn.close()
    assert os.stat(tmp_path / "dir").st_mode & 0o777 == 0o700
    for f in (tmp_path / "dir").iterdir():
        assert f.stat().st_mode & 0o077 == 0, f
    os.chmod(tmp_path / "dir" / "notify.db", 0o644)
    with pytest.raises(subs.SubscriptionError, match="readable by other users"):
        stored_subs.open_store(tmp_path / "dir" / "notify.db")


def test_a_subscription_matches_only_its_owners_alerts():
    sub = stored_subs.Subscription(
        id=1, uid=1000, url="json://h/x", kinds=subs.DEFAULT_KINDS + ("gpu.idle_held",)
    )
    admin = stored_subs.Subscription(id=2, uid=None, url="json://h/y", kinds=subs.ADMIN_KINDS)

    def alert(kind, uid):
        return Alert(kind=kind, incident="i", ts_ms=0, host="h", title="t", body="b", uid=uid, id=5)

    assert subs.matches(sub, alert("run.failed", 1000), None)
    assert not subs.matches(sub, alert("run.failed", 1001), None)  # another user's run
    assert not subs.matches(sub, alert("gpu.lost", None), None)  # a GPU's: the admins'
    assert subs.matches(admin, alert("gpu.lost", None), None)
    assert subs.matches(admin, alert("gpu.idle_held", 1001), None)  # every user's idle GPU
    assert not subs.matches(admin, alert("run.failed", 1001), None)


def test_terminal_line_reaches_the_owners_pty_without_escape_sequences(tmp_path, shared_db, monkeypatch):
    from gpuwatch.alerts import terminals

    db, conn = shared_db
    master, slave = os.openpty()
    try:
        monkeypatch.setattr(terminals, "user_terminals", lambda uid: [os.ttyname(slave)])
        store_alerts.record(
            conn,
            Alert(
                kind="run.failed",
                incident="t",
                ts_ms=1,
                host="h",
                uid=os.getuid(),
                title="run \x1b]0;evil\x07x failed",
                body="b",
            ),
        )
        store_alerts.record(
            conn,
            Alert(
                kind="run.failed",
                incident="u",
                ts_ms=1,
                host="h",
                uid=12345,
                title="someone else's",
                body="b",
            ),
        )
        store = stored_subs.open_store(tmp_path / "notify.db")
        store.execute("INSERT INTO cursor (id, alert_id) VALUES (1, 0)")
        store.close()
        off = Deliverer(tmp_path / "notify.db", db)  # off by default: nothing written
        off.deliver_once()
        off.close()
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 1000)
        tmp_path.joinpath("notify.db").unlink()
        on = Deliverer(tmp_path / "notify.db", db, terminals_uid=os.getuid())
        on.conn.execute("INSERT INTO cursor (id, alert_id) VALUES (1, 0)")
        on.deliver_once()
        on.close()
        os.set_blocking(master, True)  # written before deliver_once returned
        text = os.read(master, 1000).decode(errors="replace")
        assert "[gpuwatch] run  ]0;evil x failed" in text and "\x1b" not in text
        assert "someone else" not in text
    finally:
        os.close(master)
        os.close(slave)


def test_one_deliverer_per_store_so_a_wrapper_beside_a_user_daemon_sends_nothing_twice(
    tmp_path, shared_db, hook
):
    from gpuwatch.alerts.run_delivery import deliver_after_run

    db, conn = shared_db
    store = stored_subs.open_store(tmp_path / "notify.db")
    stored_subs.add(store, 0, hook.url(), subs.DEFAULT_KINDS)
    store.close()
    daemons = Deliverer(tmp_path / "notify.db", db, group_s=0)
    try:
        assert daemons.owns_store()
        fire(conn, "run.finished", run_id="r1")
        started = time.monotonic()
        assert deliver_after_run(tmp_path / "notify.db", db, "r1", 0) == 0
        assert time.monotonic() - started < 5 and not hook.received  # left to the daemon
        wait_for(lambda: daemons.deliver_once() or hook.received, timeout=60)
    finally:
        daemons.close()
    assert deliver_after_run(tmp_path / "notify.db", db, "r1", 0, end_wait_s=0) == 0
    assert len(hook.received) == 1
