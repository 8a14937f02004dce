"""A full disk under everything the daemon writes: the database, its WAL, the socket's directory
with the health report, and the spool, all on one small tmpfs. One warning when it fills, one
when it clears, never a traceback; periods are shortened so seconds stand for minutes."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import fake_pynvml
import pytest
from systools import wait_for
from test_hostile import Filler, Records, small_disk  # noqa: F401 (a fixture)

from gpuwatch.base.config import Config
from gpuwatch.daemon.main import Daemon
from gpuwatch.store import health
from gpuwatch.store import writer as writer_mod


@pytest.mark.slow
def test_database_socket_and_health_file_on_one_full_disk_log_three_lines_and_no_traceback(
    small_disk,  # noqa: F811 (the fixture)
    monkeypatch,
):
    # Housekeeping every 0.05 s instead of 5 s, early retention every 0.1 s instead of 30 s:
    # 4 s full stand for the 10 minutes of the goal (80 housekeeping passes, 40 reclaims: more
    # than a 10-minute episode has).
    monkeypatch.setattr(writer_mod, "HOUSEKEEPING_S", 0.05)
    monkeypatch.setattr(writer_mod, "RECLAIM_EVERY_S", 0.1)
    monkeypatch.setattr(writer_mod, "RECOVERED_AFTER_S", 0.3)
    records = Records()
    logger = logging.getLogger("gpuwatch")
    logger.addHandler(records)
    old_level, logger.level = logger.level, logging.DEBUG
    disk = small_disk
    db, sock = disk / "gpuwatch.db", disk / "gw.sock"
    cfg = Config(
        db=str(db),
        socket=str(sock),
        spool_dir=str(disk / "spool"),
        interval=0.05,
        host_interval=0.05,
        spool_scan_interval=0.1,
        system=True,
    )
    daemon = Daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8))
    thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()))
    thread.start()
    filler = Filler(disk / "filler")
    try:
        wait_for(sock.exists)
        time.sleep(0.5)
        before = len(records.records)
        filler.start()
        wait_for(lambda: daemon.writer.health is not None)
        time.sleep(4.0)
        during = records.records[before:]
        assert daemon.writer.health.failed_jobs > 20  # it kept trying all along
        filler.stop()
        wait_for(lambda: daemon.writer.health is None and health.read(db, [sock]) is None)
        time.sleep(0.5)
        episode = [r for r in records.records[before:] if r.levelno >= logging.INFO]
    finally:
        if filler.is_alive():
            filler.stop()
        daemon.request_stop()
        thread.join(15)
        logger.removeHandler(records)
        logger.setLevel(old_level)
    lines = [f"{r.levelname}: {r.getMessage()}" for r in episode]
    assert records.tracebacks() == [], lines
    assert len(lines) <= 3, "\n".join(lines)
    assert str(db) in lines[0] and "bytes free" in lines[0]
    assert "again" in lines[-1]
    assert [r for r in during if r.levelno >= logging.INFO][0] is episode[0]


def test_a_client_spooling_onto_a_full_disk_says_so_once_and_again_once(small_disk, caplog):  # noqa: F811 (the fixture)
    from gpuwatch.client.transport import DaemonTransport

    caplog.set_level(logging.DEBUG, logger="gpuwatch")
    spool = small_disk / "spool"
    filler = Filler(small_disk / "filler")
    filler.start()
    filler.full.wait(10)
    away = DaemonTransport(Config(), small_disk / "no-daemon.sock", spool_dir=spool, max_backoff=0.05)
    try:
        for i in range(200):  # the daemon is away and the spool's disk is full
            away.send({"id": f"e{i}", "kind": "step", "run_id": "r", "ts_ms": 1 + i, "step": i})
            time.sleep(0.005)
        assert away.flush(10)
        assert away.dropped > 0
        filler.stop()
        away.send({"id": "later", "kind": "step", "run_id": "r", "ts_ms": 999, "step": 999})
        assert away.flush(10)
        assert wait_for(lambda: away.spool_path.exists())
    finally:
        if filler.is_alive():
            filler.stop()
        away.close()
    lines = [r for r in caplog.records if "spool" in r.getMessage() and r.levelno >= logging.WARNING]
    assert [r.exc_info for r in caplog.records if r.exc_info] == []
    assert len(lines) == 3, [r.getMessage() for r in lines]  # full, room again, kept for replay at exit
    assert str(away.spool_path) in lines[0].getMessage() and "bytes free there" in lines[0].getMessage()
    assert "again" in lines[1].getMessage()


def test_a_profiler_trace_that_does_not_fit_leaves_no_half_written_file(small_disk):  # noqa: F811 (the fixture)
    from collectors import torch_profiler

    class Prof:  # a trace that fits, but not twice: its gzipped copy runs out of room
        def export_chrome_trace(self, path):
            with open(path, "wb") as f:
                f.write(os.urandom(7 << 19))  # 3.5 MB of the 6 MB, incompressible

    directory = small_disk / "profiles"
    with pytest.raises(OSError) as e:
        torch_profiler.save_trace(Prof(), directory, "scheduled-1", 1 << 30)
    assert e.value.errno == 28  # ENOSPC: the client says so once (gpuwatch/client/profiling.py)
    assert list(directory.iterdir()) == []
