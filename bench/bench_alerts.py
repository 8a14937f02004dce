"""Alert delivery: time from an alert row to the HTTP request, the delivering process's CPU
with 100 subscriptions against none (side by side, in one run), and an endpoint outage.

Usage: python bench/bench_alerts.py [--phase-seconds 30] [--rounds 2] [--outage-minutes 10]
The deliverer is the real `gpuwatch notify serve` (what gpuwatch-notify.service runs, and what a
user daemon runs in a thread) reading a real SQLite database; alerts are stored one a second as
the rules store them; the endpoint is a loopback JSON webhook reached through a real apprise.
With 100 subscriptions they belong to 100 users (one each, as on a shared server) and each
alert is one user's, so every alert is one message. `--outage-minutes 0` skips the outage.
The system daemon does no delivery at all (it has no network), so its CPU is not changed by
subscriptions; this measures the process that does the work.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from alert_endpoints import Hook  # noqa: E402

from gpuwatch.alerts import subscriptions as subs  # noqa: E402
from gpuwatch.store import alerts as store_alerts  # noqa: E402
from gpuwatch.store import open_rw  # noqa: E402
from gpuwatch.store.alerts import Alert  # noqa: E402

USERS = 100
SERVE = (
    "import sys; from gpuwatch.cli import main; sys.argv = ['gpuwatch', 'notify', 'serve', '--user']; main()"
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Setup:
    """One deliverer over its own database and private store, with `n` subscriptions."""

    def __init__(self, where: Path, n: int, hook: Hook):
        where.mkdir()
        self.db = open_rw(where / "gw.db")
        store = subs.open_store(where / "notify.db")
        for uid in range(n):
            subs.add(store, 1000 + uid, hook.url(f"user{uid}"), subs.DEFAULT_KINDS)
        store.close()
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            GPUWATCH_DB=str(where / "gw.db"),
            GPUWATCH_NOTIFY_DB=str(where / "notify.db"),
            GPUWATCH_NOTIFY_SOCKET=str(where / "n.sock"),
            GPUWATCH_NOTIFY_GROUP_SECONDS="0",
            GPUWATCH_CONFIG=str(where / "none.toml"),
        )
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (where / "n.sock").exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the deliverer did not start")
            time.sleep(0.05)
        self.n = 0

    def fire(self) -> tuple[str, float]:
        """Store one alert of one user's run; its title and when it was committed."""
        self.n += 1
        title = f"run #{self.n} failed"
        store_alerts.record(
            self.db,
            Alert(
                kind="run.failed",
                incident=f"bench-{self.n}",
                ts_ms=int(time.time() * 1000),
                host="bench",
                uid=1000 + self.n % USERS,
                run_id=f"r{self.n}",
                title=title,
                body="exit status 1; more: gpuwatch show r",
            ),
        )
        return title, time.monotonic()

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.db.close()


def arrival(hook: Hook, title: str) -> float | None:
    for t, message in hook.received:
        if title in message["title"] or title in message["message"]:
            return t
    return None


def phase(setup: Setup, hook: Hook, seconds: float) -> tuple[float, list[float]]:
    """Fire one alert a second for `seconds`; the deliverer's CPU % and each alert's latency (s)."""
    fired = []
    start_cpu, start = cpu_s(setup.proc.pid), time.monotonic()
    while time.monotonic() - start < seconds:
        fired.append(setup.fire())
        time.sleep(1.0)
    cpu = 100 * (cpu_s(setup.proc.pid) - start_cpu) / (time.monotonic() - start)
    time.sleep(2)
    latencies = [arrival(hook, title) - t for title, t in fired if arrival(hook, title) is not None]
    return cpu, latencies


def outage(setup: Setup, hook: Hook, minutes: float) -> None:
    print(f"outage: endpoint down for {minutes:g} min, one alert every 10 s meanwhile", flush=True)
    hook.down = True
    fired, start = [], time.monotonic()
    while time.monotonic() - start < minutes * 60:
        fired.append(setup.fire()[0])
        time.sleep(10)
        done = time.monotonic() - start
        if int(done) % 60 < 10:
            print(
                f"  {done / 60:.1f} min down, {len(fired)} alerts waiting, {hook.refused} refused tries",
                flush=True,
            )
    before = len(hook.received)
    hook.down = False
    back = time.monotonic()
    deadline = back + 180
    while time.monotonic() < deadline and any(arrival(hook, t) is None for t in fired):
        time.sleep(0.2)
    arrived = [arrival(hook, t) for t in fired]
    lost = sum(a is None for a in arrived)
    last = max((a for a in arrived if a is not None), default=back) - back
    time.sleep(5)
    repeats = sum(
        max(0, sum(t in m["title"] + m["message"] for _, m in hook.received[before:]) - 1) for t in fired
    )
    print(
        f"outage of {minutes:g} min: {len(fired)} alerts, {lost} lost, {repeats} repeated; "
        f"all delivered {last:.1f} s after the endpoint's return (goal: <= 60 s, 0 lost)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--outage-minutes", type=float, default=10)
    args = parser.parse_args()
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    hook = Hook()
    with tempfile.TemporaryDirectory(prefix="gw-bench-alerts-") as tmp:
        setups = {"none": Setup(Path(tmp) / "none", 0, hook), "100": Setup(Path(tmp) / "100", USERS, hook)}
        cpu = {k: [] for k in setups}
        lat: list[float] = []
        try:
            for r in range(args.rounds):
                for name, setup in setups.items():  # interleaved: the same load for both
                    c, latencies = phase(setup, hook, args.phase_seconds)
                    cpu[name].append(c)
                    if name == "100":
                        lat += latencies
                    print(f"round {r + 1}/{args.rounds}, {name:>4} subscriptions: CPU {c:.2f} %", flush=True)
            fired = setups["100"].n
            print("\n| what | figure | goal |\n|---|---|---|")
            print(f"| alert row -> HTTP request, median | {statistics.median(lat) * 1000:.0f} ms | <= 10 s |")
            print(
                f"| alert row -> HTTP request, max | {max(lat) * 1000:.0f} ms ({len(lat)}/{fired} delivered) | <= 10 s |"
            )
            for name in setups:
                print(
                    f"| deliverer CPU, {name} subscriptions, 1 alert/s | {statistics.mean(cpu[name]):.2f} % | - |"
                )
            print(f"| load average | {open('/proc/loadavg').read().split()[0]} | |", flush=True)
            if args.outage_minutes > 0:
                outage(setups["100"], hook, args.outage_minutes)
        finally:
            for setup in setups.values():
                setup.close()
            hook.close()


if __name__ == "__main__":
    main()
