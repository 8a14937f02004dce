"""Runs killed by the kernel OOM killer: the kernel log names the pid -> `killed`, not `lost`."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from collectors.kmsg import oom_killed
from gpuwatch.monitor.runs_watch import RunsWatch
from gpuwatch.store import open_rw
from gpuwatch.store.events import Peer, apply_events

GPUWATCH = str(Path(sys.executable).parent / "gpuwatch")

# Records as /dev/kmsg hands them out: "prio,seq,usec,flags;message", dictionary lines indented.
KMSG = """\
6,1001,5000,-;python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
 SUBSYSTEM=memory
3,1002,5001,-;Out of memory: Killed process 4242 (python) total-vm:90000kB, anon-rss:80000kB, file-rss:0kB
3,1003,5002,-;Memory cgroup out of memory: Killed process 5151 (torchrun) total-vm:10kB, anon-rss:9kB
6,1004,5003,-;oom_reaper: reaped process 4242 (python), now anon-rss:0kB
6,1005,5004,-;Killed process 6000 (unrelated) by something else
"""


def test_kernel_log_names_the_oom_killers_victims(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(KMSG)
    found = oom_killed({4242, 5151, 6000, 7}, path=str(log))
    assert set(found) == {4242, 5151}
    assert found[4242].startswith("Out of memory: Killed process 4242 (python)")
    assert found[5151].startswith("Memory cgroup out of memory: Killed process 5151")


def test_unreadable_kernel_log_means_unknown(tmp_path):
    assert oom_killed({1}, path=str(tmp_path / "missing")) == {}


def test_watch_marks_an_oom_killed_run_killed_with_its_last_memory(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    for run_id, pid in (("victim", 4242), ("vanished", 4343)):
        peer = Peer(uid=1000, user="alice", pid=pid, mode="daemon")
        apply_events(
            conn,
            [
                {"id": f"{run_id}-s", "kind": "run_start", "run_id": run_id, "ts_ms": 1000},
                {
                    "id": f"{run_id}-1",
                    "kind": "step",
                    "run_id": run_id,
                    "ts_ms": 2000,
                    "step": 12,
                    "rss_bytes": 30 * 2**30,
                    "mem_allocated_bytes": 5 * 2**30,
                },
            ],
            peer,
        )
    asked = []

    def kernel_log(pids):
        asked.append(pids)
        return {4242: "Out of memory: Killed process 4242 (python) total-vm:90000kB"}

    watch = RunsWatch(writer=None, alive=lambda pid, started: False, killed_by_oom=kernel_log)
    assert watch.check(conn) == ["vanished"]
    assert asked == [{4242, 4343}]  # one look at the kernel log for every run that died
    rows = dict(
        (r[0], r[1:])
        for r in conn.execute("SELECT run_id, status, signal, error_type, error_message, ended_ms FROM runs")
    )
    status, signum, error_type, message, ended = rows["victim"]
    assert (status, signum, error_type, ended) == ("killed", 9, "OOMKilled", 2000)
    assert message.startswith(
        "killed by the kernel OOM killer (SIGKILL); at step 12: RSS 30.0 GiB, "
        "GPU allocated 5.0 GiB; kernel: Out of memory: Killed process 4242"
    )
    assert rows["vanished"][0] == "lost"


def test_a_sigkill_from_someone_else_is_not_blamed_on_the_oom_killer(tmp_path):
    db = tmp_path / "gw.db"
    env = dict(os.environ, GPUWATCH_DB=str(db), GPUWATCH_SOCKET=os.devnull)
    done = subprocess.run(
        [GPUWATCH, "run", "--name", "self-kill", "--", "sh", "-c", "kill -9 $$"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 128 + 9
    row = (
        sqlite3.connect(db)
        .execute("SELECT status, signal, error_type FROM runs WHERE name = 'self-kill'")
        .fetchone()
    )
    assert row == ("killed", 9, None)
