"""The scheduler: exact deadlines on a fake clock, no overlap, interleaving, prompt stop."""

from __future__ import annotations

import threading
import time

from gpuwatch.monitor.scheduler import Scheduler


class FakeClock:
    """Time moves only when the scheduler waits or a job says it took a while."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return False


def make(clock: FakeClock) -> Scheduler:
    return Scheduler(clock=clock, wait=clock.wait)


def test_deadlines_do_not_drift_even_when_each_tick_takes_time():
    clock = FakeClock()
    sched = make(clock)
    starts = []

    def tick():
        starts.append(clock.now)
        clock.now += 0.3  # work that takes 30% of the interval
        if len(starts) == 1000:
            sched.stop()

    sched.add("gpu", 1.0, tick)
    sched.run()
    assert starts == [1000.0 + i for i in range(1000)]


def test_slow_job_skips_missed_deadlines_instead_of_bursting():
    clock = FakeClock()
    sched = make(clock)
    starts = []

    def tick():
        starts.append(clock.now)
        if len(starts) == 2:
            clock.now += 3.5  # overruns deadlines 1002, 1003, 1004, 1005
        if len(starts) == 4:
            sched.stop()

    job = sched.add("gpu", 1.0, tick)
    sched.run()
    assert starts == [1000.0, 1001.0, 1005.0, 1006.0]  # never two runs closer than the interval
    assert job.skipped == 3  # 1002, 1003, 1004 passed while the job was still running
    assert job.runs == 4


def test_two_intervals_interleave():
    clock = FakeClock()
    sched = make(clock)
    log = []
    sched.add("fast", 1.0, lambda: log.append(("fast", clock.now)))

    def slow():
        log.append(("slow", clock.now))
        if clock.now >= 1006.0:
            sched.stop()

    sched.add("slow", 2.5, slow, first_delay=0.5)
    sched.run()
    slow_times = [t for name, t in log if name == "slow"]
    fast_times = [t for name, t in log if name == "fast"]
    assert slow_times == [1000.5, 1003.0, 1005.5, 1008.0]
    assert fast_times == [1000.0 + i for i in range(9)]
    assert [t for _, t in log] == sorted(t for _, t in log)


def test_failing_job_is_counted_and_others_keep_running():
    clock = FakeClock()
    sched = make(clock)
    good = []

    def bad():
        raise RuntimeError("collector broke")

    def ok():
        good.append(clock.now)
        if len(good) == 3:
            sched.stop()

    bad_job = sched.add("bad", 1.0, bad)
    sched.add("ok", 1.0, ok)
    sched.run()
    assert len(good) == 3
    assert bad_job.errors == 3 and "collector broke" in bad_job.last_error


def test_real_thread_stops_promptly_during_a_long_sleep():
    sched = Scheduler()
    ran = threading.Event()
    sched.add("rare", 3600.0, ran.set)
    sched.start()
    assert ran.wait(2.0)
    t0 = time.monotonic()
    sched.stop()
    assert time.monotonic() - t0 < 1.0
    assert not sched._thread.is_alive()


def test_periodic_runs_its_job_at_start_and_on_after_a_failure_in_its_own_thread_until_stopped(caplog):
    from systools import wait_for

    from gpuwatch.monitor.periodic import Periodic

    runs, threads = [], []

    def job():
        runs.append(threading.current_thread().name)
        if len(runs) == 2:
            raise OSError("a full disk, say")

    periodic = Periodic("test job", 0.05, job, setup=lambda: threads.append(threading.current_thread().name))
    periodic.start()
    try:
        wait_for(lambda: len(runs) >= 4, timeout=30)  # the failing second run did not end it
    finally:
        periodic.stop()
    stopped_at = len(runs)
    time.sleep(0.2)
    assert len(runs) == stopped_at  # stopped for good
    assert set(runs) == {"gpuwatch-test-job"} and threads == ["gpuwatch-test-job"]  # setup ran first, there
    assert periodic.job.errors == 1 and "test job failed" in caplog.text
