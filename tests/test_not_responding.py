"""'Not responding' means a GPU's own NVML call was late: never that our process was busy.

The sampler runs in this process on 8 simulated GPUs (tests/fake_pynvml.py) at 10 Hz, as in the
daemon; a second thread holds the GIL in long stretches (json.loads of a large document, the way
a spool replay parses events) or a GPU's calls really block.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

import fake_pynvml
from systools import wait_for

from gpuwatch.base.config import load
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer

INTERVAL = 0.1  # 10 Hz: a GPU's calls get 50 ms (NVML_DEADLINE_MIN_S)


def start_sampler(tmp_path, nvml):
    db = tmp_path / "gw.db"
    writer = Writer(db)
    cfg = load({"db": str(db), "interval": INTERVAL, "host_interval": INTERVAL, "system": False})
    sampler = Sampler(writer, cfg, nvml_module=nvml)
    sampler.start()
    return db, writer, sampler


def stop_sampler(writer, sampler):
    sampler.stop()
    writer.close()


def gil_hog(seconds: float) -> int:
    """Parse a large JSON document over and over: each parse holds the GIL ~0.1-0.3 s."""
    doc = json.dumps([{"step": i, "loss": 1.0 / (i + 1), "tokens": 256} for i in range(150_000)])
    parses = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        json.loads(doc)
        parses += 1
    return parses


def test_no_gpu_is_declared_not_responding_while_the_gil_is_busy(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=6)
    db, writer, sampler = start_sampler(tmp_path, nvml)
    try:
        wait_for(lambda: sampler.last_tick_at, timeout=30)
        started_ms = int(time.time() * 1000)
        result = []
        hog = threading.Thread(target=lambda: result.append(gil_hog(4.0)))
        hog.start()
        hog.join(60)
        assert result and result[0] > 3  # the hog really held the GIL, again and again
        ended_ms = int(time.time() * 1000)
        time.sleep(3 * INTERVAL)
    finally:
        stop_sampler(writer, sampler)
    conn = sqlite3.connect(db)
    hung = conn.execute("SELECT gpu_index, ts_ms FROM gpu_samples WHERE state = 'hung'").fetchall()
    per_gpu = dict(
        conn.execute(
            "SELECT gpu_index, count(*) FROM gpu_samples WHERE ts_ms BETWEEN ? AND ? GROUP BY gpu_index",
            (started_ms, ended_ms),
        ).fetchall()
    )
    conn.close()
    assert hung == []
    assert not [r.getMessage() for r in caplog.records if "not responding" in r.getMessage()]
    # Every GPU still read during the hog (how often depends on how much of the GIL and the CPU the
    # sampler got: on a loaded 2-core box, once in 4 s), and none of them called hung for it.
    assert sorted(per_gpu) == list(range(8)) and min(per_gpu.values()) >= 1


def test_a_gpu_whose_call_blocks_is_not_responding_within_about_an_interval(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=1)
    db, writer, sampler = start_sampler(tmp_path, nvml)

    def rows(sql, *args):
        conn = sqlite3.connect(db)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    try:
        wait_for(lambda: sampler.last_tick_at, timeout=30)
        nvml.set_hung(5)
        hung_at_ms = int(time.time() * 1000)
        shown = wait_for(
            lambda: rows("SELECT min(ts_ms) FROM gpu_samples WHERE gpu_index = 5 AND state = 'hung'")[0][0],
            timeout=30,
        )
        assert sampler.nvml.not_responding_since(5) is not None
        # The tick that found it had begun within one interval of the hang; its ts_ms is the tick's.
        assert shown - hung_at_ms <= 2 * INTERVAL * 1000
        time.sleep(5 * INTERVAL)
        others = rows(
            "SELECT count(*) FROM gpu_samples WHERE gpu_index != 5 AND ts_ms > ? AND state IS NULL", shown
        )[0][0]
        assert others >= 7 * 4  # the other seven kept sampling every tick
        nvml.set_hung(5, False)
        wait_for(lambda: sampler.nvml.not_responding_since(5) is None, timeout=30)
    finally:
        nvml.set_hung(5, False)
        stop_sampler(writer, sampler)
