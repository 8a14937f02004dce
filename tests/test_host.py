"""HostCollector on this machine's real psutil, and the cgroup readers on real-format trees."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import psutil

from collectors.host import HostCollector, HostSample, cgroup_memory_limit_bytes, cgroup_oom_kills
from gpuwatch.store import insert_rows, open_rw


def test_a_real_sample_has_sane_values(tmp_path):
    c = HostCollector()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # keep one core busy so the CPU share is clearly above zero
        pass
    s = c.sample(1000)
    assert s.ts_ms == 1000
    assert s.cpu_pct is not None and 0 < s.cpu_pct <= 100
    assert s.load1 >= 0 and s.load5 >= 0 and s.load15 >= 0
    assert 0 < s.mem_used_bytes < s.mem_total_bytes == psutil.virtual_memory().total
    assert 0 < s.mem_available_bytes <= s.mem_total_bytes
    assert s.swap_used_bytes >= 0
    if Path("/dev/shm").is_dir():
        assert s.shm_total_bytes > 0 and 0 <= s.shm_used_bytes <= s.shm_total_bytes
    # The row goes straight into host_samples.
    conn = open_rw(tmp_path / "t.db")
    insert_rows(conn, "host_samples", [dataclasses.asdict(s)])
    assert conn.execute("SELECT mem_total_bytes FROM host_samples").fetchone()[0] == s.mem_total_bytes


def test_counters_are_cumulative_and_shm_use_is_seen(tmp_path):
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    c = HostCollector(shm_path=str(shm))
    first = c.sample(1000)
    blob = shm / f"gpuwatch-test-{os.getpid()}"
    blob.write_bytes(os.urandom(8 * 1024 * 1024))
    try:
        second = c.sample(2000)
    finally:
        blob.unlink()
    for name in ("disk_read_bytes", "disk_write_bytes", "net_rx_bytes", "net_tx_bytes"):
        a, b = getattr(first, name), getattr(second, name)
        assert (a is None) == (b is None) and (a is None or b >= a), name
    assert second.shm_used_bytes >= first.shm_used_bytes + 4 * 1024 * 1024


def test_missing_shm_reads_as_none():
    s = HostCollector(shm_path="/nonexistent/shm").sample(1)
    assert s.shm_total_bytes is None and s.shm_used_bytes is None
    assert isinstance(s, HostSample) and s.mem_total_bytes > 0


def test_figures_match_psutils_definitions():
    c = HostCollector()
    ours = c.sample(1)
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    disk, nics = psutil.disk_io_counters(), psutil.net_io_counters(pernic=True)
    c.close()
    assert ours.mem_total_bytes == vm.total and ours.swap_used_bytes == swap.used
    assert abs(ours.mem_available_bytes - vm.available) < 64 * 2**20  # read a moment apart
    assert abs(ours.mem_used_bytes - vm.used) < 64 * 2**20
    if disk is None:
        assert ours.disk_read_bytes is None
    else:  # whole disks only, 512-byte sectors; a little I/O may happen in between
        assert 0 <= disk.read_bytes - ours.disk_read_bytes < 64 * 2**20
        assert 0 <= disk.write_bytes - ours.disk_write_bytes < 64 * 2**20
    rx = sum(n.bytes_recv for name, n in nics.items() if name != "lo")
    assert 0 <= rx - ours.net_rx_bytes < 2**20
    # Memory pressure, as psutil counts it (its swap counters assume 4 KiB pages).
    assert abs(ours.page_cache_bytes - vm.cached) < 64 * 2**20
    if os.sysconf("SC_PAGE_SIZE") == 4096:
        assert 0 <= swap.sin - ours.swap_in_bytes < 64 * 2**20
        assert 0 <= swap.sout - ours.swap_out_bytes < 64 * 2**20


def test_swapping_and_page_cache_are_read_from_the_kernels_counters(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 50 1000 10 0 0 0 0 0\n")
    (proc / "meminfo").write_text(
        "MemTotal:       16384000 kB\nMemAvailable:    8192000 kB\n"
        "Cached:          3000000 kB\nSReclaimable:     200000 kB\n"
    )
    (proc / "vmstat").write_text("nr_free_pages 12345\npgpgin 999\npswpin 250\npswpout 1000\npgfault 77\n")
    collector = HostCollector(proc=proc)
    page = os.sysconf("SC_PAGE_SIZE")
    s = collector.sample(1)
    assert (s.swap_in_bytes, s.swap_out_bytes) == (250 * page, 1000 * page)
    assert s.page_cache_bytes == 3200000 * 1024
    (proc / "vmstat").write_text("nr_free_pages 12345\npswpin 300\npswpout 4000\n")
    s = collector.sample(2)  # re-read each tick through the handle kept open
    assert (s.swap_in_bytes, s.swap_out_bytes) == (300 * page, 4000 * page)
    collector.close()


def test_a_proc_without_disks_or_network_reads_them_as_none(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 50 1000 10 0 0 0 0 0\ncpu0 100 0 50 1000 10 0 0 0 0 0\n")
    (proc / "meminfo").write_text(
        "MemTotal:       16384000 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:    8192000 kB\nSwapTotal:       2000000 kB\n"
        "SwapFree:        1500000 kB\n"
    )
    s = HostCollector(proc=proc).sample(1)
    assert (s.mem_total_bytes, s.mem_used_bytes, s.mem_available_bytes, s.swap_used_bytes) == (
        16384000 * 1024,
        8192000 * 1024,
        8192000 * 1024,
        500000 * 1024,
    )
    assert (s.disk_read_bytes, s.disk_write_bytes, s.net_rx_bytes, s.net_tx_bytes) == (None,) * 4
    assert (s.swap_in_bytes, s.swap_out_bytes, s.page_cache_bytes) == (None,) * 3  # no vmstat, no Cached
    assert s.cpu_pct is None  # the counters did not move since the baseline


def _tree(tmp_path, cgroup_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/<pid>/cgroup file and a /sys/fs/cgroup tree, in the kernel's formats."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(cgroup_line)
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    return proc, root


def test_cgroup_v2_limit_is_the_tightest_on_the_path(tmp_path):
    proc, root = _tree(
        tmp_path,
        "0::/user.slice/user-1000.slice/job.scope\n",
        {
            "user.slice/memory.max": "max\n",
            "user.slice/user-1000.slice/memory.max": "68719476736\n",
            "user.slice/user-1000.slice/job.scope/memory.max": "max\n",
            "user.slice/user-1000.slice/job.scope/memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n",
        },
    )
    assert cgroup_memory_limit_bytes(4242, root=root, proc=proc) == 64 * 1024**3
    assert cgroup_oom_kills(4242, root=root, proc=proc) == 2


def test_cgroup_v2_unlimited_is_none(tmp_path):
    proc, root = _tree(
        tmp_path,
        "0::/system.slice/gpuwatch.service\n",
        {
            "system.slice/gpuwatch.service/memory.max": "max\n",
            "system.slice/gpuwatch.service/memory.events": "oom_kill 0\n",
        },
    )
    assert cgroup_memory_limit_bytes(4242, root=root, proc=proc) is None
    assert cgroup_oom_kills(4242, root=root, proc=proc) == 0


def test_cgroup_v1_limit_and_oom_kills(tmp_path):
    line = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n"
    proc, root = _tree(
        tmp_path,
        line,
        {
            "memory/docker/abc/memory.stat": "cache 0\nrss 4096\nhierarchical_memory_limit 17179869184\n",
            "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
        },
    )
    assert cgroup_memory_limit_bytes(4242, root=root, proc=proc) == 16 * 1024**3
    assert cgroup_oom_kills(4242, root=root, proc=proc) == 5


def test_cgroup_v1_no_limit_is_none(tmp_path):
    # Inside a container the mount shows only its own cgroup: fall back to the mount's root.
    proc, root = _tree(
        tmp_path,
        "4:memory:/process_api/f3d8\n",
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert cgroup_memory_limit_bytes(4242, root=root, proc=proc) is None
    assert cgroup_oom_kills(4242, root=root, proc=proc) is None


def test_cgroup_readers_on_this_machine_never_raise():
    limit = cgroup_memory_limit_bytes()
    kills = cgroup_oom_kills()
    assert limit is None or limit > 0
    assert kills is None or kills >= 0
    assert cgroup_memory_limit_bytes(2**22 + 123) is None  # no such pid
