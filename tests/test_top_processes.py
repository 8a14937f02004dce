"""The host's top CPU consumers (on a GPU or not) and its memory pressure, stored by the sampler
at each process tick: the evidence `gpuwatch why` reads for "who took the CPUs"."""

from __future__ import annotations

import os
import pwd
import sqlite3
import subprocess
import sys
import time

import fake_pynvml
import psutil
from systools import wait_for

from gpuwatch.base.config import load
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer

HOG = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass  # gw-top-hog"


def rows(db, sql, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def run_sampler(tmp_path, nvml, **cfg):
    db = tmp_path / "gw.db"
    writer = Writer(db)
    config = load(
        {
            "db": str(db),
            "interval": 0.2,
            "host_interval": 0.2,
            "process_interval": 0.5,
            "system": False,
            **cfg,
        }
    )
    sampler = Sampler(writer, config, nvml_module=nvml)
    sampler.start()
    return db, writer, sampler


def test_a_cpu_hog_on_no_gpu_is_stored_with_who_it_is_at_each_process_tick(tmp_path):
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    gpu_child = subprocess.Popen(["sleep", "120"])
    # Top 50: on a shared test box other busy processes must not push the hog out.
    db, writer, sampler = run_sampler(
        tmp_path, fake_pynvml.FakeNvml(gpus=2, procs={0: [gpu_child.pid]}), top_processes=50
    )
    try:
        query = (
            "SELECT ts_ms, start_ms, uid, user, cmdline, cpu_pct, rss_bytes FROM host_top_processes "
            "WHERE pid = ? ORDER BY ts_ms"
        )
        found = wait_for(lambda: (lambda r: r if len(r) >= 3 else None)(rows(db, query, hog.pid)), timeout=60)
        ts, start_ms, uid, user, cmdline, cpu, rss = found[-1]
        assert uid == os.getuid() and user == pwd.getpwuid(os.getuid()).pw_name
        assert "gw-top-hog" in cmdline
        assert abs(start_ms - psutil.Process(hog.pid).create_time() * 1000) < 1000
        assert cpu >= 5 and rss > 1_000_000  # a busy loop: a real share of a core
        stamps = [r[0] for r in found]
        assert len(set(stamps)) == len(stamps) >= 3  # one row per process tick
        assert all(b - a >= 400 for a, b in zip(stamps, stamps[1:]))  # every process_interval
        # A sleeping process is nobody's top consumer; the GPU process's usage comes from the same walk.
        assert rows(db, "SELECT 1 FROM host_top_processes WHERE pid = ?", gpu_child.pid) == []
        assert wait_for(
            lambda: rows(
                db, "SELECT rss_bytes FROM gpu_process_samples WHERE pid = ? AND rss_bytes > 0", gpu_child.pid
            )
        )
        # Memory pressure beside it, in every host sample.
        swap_in, swap_out, cache = rows(
            db,
            "SELECT swap_in_bytes, swap_out_bytes, page_cache_bytes "
            "FROM host_samples ORDER BY ts_ms DESC LIMIT 1",
        )[0]
        assert swap_in is not None and swap_out is not None and cache > 0
    finally:
        sampler.stop()
        writer.close()
        for child in (hog, gpu_child):
            child.kill()
            child.wait()


def test_top_processes_are_the_busiest_few_and_none_when_switched_off(tmp_path):
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    db, writer, sampler = run_sampler(tmp_path, None, top_processes=2)
    db0 = tmp_path / "off"
    db0.mkdir()
    db_off, writer_off, sampler_off = run_sampler(db0, None, top_processes=0)
    try:
        wait_for(
            lambda: len({r[0] for r in rows(db, "SELECT ts_ms FROM host_top_processes")}) >= 3, timeout=60
        )
        per_tick = rows(db, "SELECT ts_ms, count(*), min(cpu_pct) FROM host_top_processes GROUP BY ts_ms")
        assert all(n <= 2 and low >= 1.0 for _, n, low in per_tick)
        time.sleep(1.0)
        assert rows(db_off, "SELECT count(*) FROM host_top_processes") == [(0,)]
        assert rows(db_off, "SELECT count(*) FROM host_samples")[0][0] > 0
    finally:
        for s, w in ((sampler, writer), (sampler_off, writer_off)):
            s.stop()
            w.close()
        hog.kill()
        hog.wait()
