"""ProcessCollector on real child processes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import psutil
import pytest

from collectors import processes
from collectors.processes import ProcessCollector, ProcessInfo, container_id_from_cgroup

NO_SUCH_PID = 2**22 + 123  # above Linux's largest pid_max


@pytest.fixture
def child():
    env = dict(
        os.environ, RANK="1", LOCAL_RANK="1", WORLD_SIZE="4", SLURM_JOB_ID="777", CUDA_VISIBLE_DEVICES="2,3"
    )
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "two words"], env=env)
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def test_a_child_is_read_correctly(child):
    before_ms = time.time() * 1000
    info = ProcessCollector().info(child.pid)
    assert info == ProcessInfo(
        pid=child.pid,
        start_ms=info.start_ms,
        uid=os.getuid(),
        user=info.user,
        cmdline=f"{sys.executable} -c 'import time; time.sleep(60)' 'two words'",
        container_id=info.container_id,
        slurm_job_id="777",
        rank=1,
        local_rank=1,
        world_size=4,
        cuda_visible_devices="2,3",
    )
    assert abs(info.start_ms - before_ms) < 5_000
    assert info.user and isinstance(info.user, str)
    assert set(dataclasses.asdict(info)) <= {
        "pid",
        "start_ms",
        "uid",
        "user",
        "cmdline",
        "container_id",
        "slurm_job_id",
        "rank",
        "local_rank",
        "world_size",
        "cuda_visible_devices",
        "run_id",
        "first_seen_ms",
        "last_seen_ms",
    }


def test_facts_are_read_once_per_process(child):
    c = ProcessCollector()
    assert c.info(child.pid) is c.info(child.pid)


def test_untagged_process_has_no_tags():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")
    }
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        info = ProcessCollector().info(proc.pid)
        assert (info.rank, info.world_size, info.slurm_job_id, info.cuda_visible_devices) == (
            None,
            None,
            None,
            None,
        )
    finally:
        proc.kill()
        proc.wait()


def test_usage_gives_rss_and_cpu_after_a_baseline():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # let the interpreter start
        c = ProcessCollector()
        first = c.usage([busy.pid, NO_SUCH_PID])
        assert list(first) == [busy.pid]
        rss, cpu = first[busy.pid]
        assert rss > 1024 * 1024 and cpu is None  # no baseline yet: unknown, not 0
        time.sleep(0.3)
        rss, cpu = c.usage([busy.pid])[busy.pid]
        assert cpu > 5.0  # a busy loop, even on a crowded machine
    finally:
        busy.kill()
        busy.wait()


def test_a_process_that_exited_reads_as_none(child):
    c = ProcessCollector()
    assert c.info(child.pid) is not None and child.pid in c.usage([child.pid])
    child.kill()
    time.sleep(0.1)  # now a zombie: exited, not yet reaped
    assert c.info(child.pid) is None
    assert c.usage([child.pid]) == {}
    child.wait()  # reaped: the pid is gone altogether
    assert c.info(child.pid) is None
    assert c.usage([child.pid]) == {}
    assert c.forget_gone() == []


def test_forget_gone_drops_exited_processes(child):
    c = ProcessCollector()
    c.usage([child.pid, os.getpid()])
    child.kill()
    child.wait()
    assert c.forget_gone() == [child.pid]
    assert list(c.usage([os.getpid()])) == [os.getpid()]


def test_a_nonexistent_pid_reads_as_none():
    c = ProcessCollector()
    assert c.info(NO_SUCH_PID) is None
    assert c.usage([NO_SUCH_PID]) == {}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0::/system.slice/docker-" + "a" * 64 + ".scope\n", "a" * 64),
        ("12:memory:/docker/" + "b" * 64 + "\n0::/docker/" + "b" * 64 + "\n", "b" * 64),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/"
            "cri-containerd-" + "c" * 64 + ".scope\n",
            "c" * 64,
        ),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-"
            + "d" * 64
            + ".scope/container\n",
            "d" * 64,
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", "session-3.scope"),
        ("0::/system.slice/jupyterhub.service\n", "jupyterhub.service"),
        ("0::/\n", None),
    ],
)
def test_container_id_from_real_cgroup_paths(text, expected):
    assert container_id_from_cgroup(text) == expected


def test_usage_baseline_survives_an_info_read_between_calls():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        c = ProcessCollector()
        c.usage([busy.pid])
        assert c.info(busy.pid) is not None  # first sight of the facts: must not reset the baseline
        time.sleep(0.3)
        assert c.usage([busy.pid])[busy.pid][1] > 5.0
    finally:
        busy.kill()
        busy.wait()


def test_usage_reads_a_process_whose_name_has_spaces_and_parentheses():
    # /proc/PID/stat puts the name in parentheses; a name holding ") (" must not shift the fields.
    odd = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "open('/proc/self/comm', 'w').write('a) b (c'); "
            "import time; print('ready', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert odd.stdout.readline() == "ready\n"  # started: its RSS no longer grows
        c = ProcessCollector()
        rss, cpu = c.usage([odd.pid])[odd.pid]
        assert open(f"/proc/{odd.pid}/comm").read().strip() == "a) b (c"
        # psutil's figure from /proc/PID/statm; the kernel's RSS counters are per-CPU batched,
        # so two reads may differ a little. A shifted field would be off by far more.
        assert abs(rss - psutil.Process(odd.pid).memory_info().rss) < 2**20 < rss and cpu is None
    finally:
        odd.kill()
        odd.wait()


def test_walk_reads_every_process_and_a_sleeper_that_wakes_gets_its_cpu_of_the_last_interval():
    code = (
        "import time\nprint('up', flush=True)\ntime.sleep(1.0)\n"
        "end = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    c = ProcessCollector()
    try:
        child.stdout.readline()  # started: asleep from now on for 1 s
        first = c.walk()
        assert first[child.pid][1] is None  # first sight: no baseline yet
        listed = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        assert {os.getpid(), os.getppid(), 1} <= first.keys()
        assert len(first.keys() & listed) >= 0.9 * len(listed)  # every process (a few come and go)
        time.sleep(0.2)
        assert c.walk()[child.pid][1] == 0.0  # asleep: its stat text did not change
        time.sleep(1.8)  # it spins from 1 s on
        rss, cpu = c.walk()[child.pid]
        # Over the 1.8 s since the previous walk (not since the first), a busy loop's share.
        assert cpu >= 10 and rss > 1_000_000
        child.kill()
        child.wait()
        assert child.pid not in c.walk()
        assert child.pid not in c._stat_files  # its handle was closed
    finally:
        child.kill()
        child.wait()
        c.close()


def _spinner(threaded: bool) -> subprocess.Popen:
    """A child that sleeps until a line comes on its stdin, then spins for 30 s: in its only
    thread, or (threaded) in a second thread while its main thread goes on sleeping."""
    spin = "sys.stdin.readline()\n    end = time.monotonic() + 30\n    while time.monotonic() < end: pass"
    code = f"import sys, threading, time\ndef spin():\n    {spin}\n" + (
        "threading.Thread(target=spin).start()\ntime.sleep(60)\n" if threaded else "spin()\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True)\n" + code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("threaded", [False, True])
def test_a_process_quiet_for_walks_then_busy_gets_its_cpu(threaded):
    """A process that has not run since the previous walk costs the walk no read of its stat
    file (its CPU clock says it did not run); once it runs, its CPU counts, whichever of its
    threads ran (with threads, only the second one runs here: the main thread sleeps)."""
    child = _spinner(threaded)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(20)]
    c = ProcessCollector()
    try:
        child.stdout.readline()
        time.sleep(0.1)
        first = c.walk()
        assert child.pid in first and all(p.pid in first for p in sleepers)
        reads = c.stat_reads
        for _ in range(3):  # asleep through these walks
            assert c.walk()[child.pid][1] == 0.0
            time.sleep(0.05)
        # Whatever else runs on this machine is read again; the 21 that sleep are not.
        assert c.stat_reads - reads <= 3 * (len(first) - 21)
        # A GPU process's RSS is stored even while it sleeps: read for it (from statm) all the same.
        sleeper = sleepers[0].pid
        rss = c.walk(exact={sleeper})[sleeper][0]
        assert abs(rss - psutil.Process(sleeper).memory_info().rss) < 2**20 and rss > 0
        assert sleeper in c._statm_files
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(1.0)
        rss, cpu = c.walk()[child.pid]
        assert cpu >= 10 and rss > 1_000_000
    finally:
        for p in (child, *sleepers):
            p.kill()
            p.wait()
        c.close()


def test_a_walk_without_listing_proc_finds_a_new_process_and_takes_none_of_its_threads_for_one(monkeypatch):
    """After the first walk, /proc is not listed while few pids were handed out: the known
    processes and the new pids that are processes are looked at. (Whatever else this machine
    starts meanwhile, the test suite's other workers included, counts as few here: over
    NEW_PIDS_PROBED of them the walk would list /proc, rightly, and this test would not test.)"""
    monkeypatch.setattr(processes, "NEW_PIDS_PROBED", 1 << 22)
    c = ProcessCollector()
    try:
        first = c.walk()
        assert os.getpid() in first and c.listings == 1
        code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(60,)).start()\nprint('up', flush=True)\ntime.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            child.stdout.readline()
            threads = {int(t) for t in os.listdir(f"/proc/{child.pid}/task")} - {child.pid}
            assert len(threads) == 3
            found = c.walk()
            assert c.listings == 1  # this walk did not list /proc
            assert child.pid in found and not threads & found.keys()
            assert os.getpid() in found
            child.kill()
            child.wait()
            assert child.pid not in c.walk()
        finally:
            child.kill()
            child.wait()
    finally:
        c.close()
