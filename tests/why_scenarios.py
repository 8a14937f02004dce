"""Hand-built databases for `gpuwatch why`: a steady run with causes injected into one window.

The run "r" (pid 1000, alice, GPU 0) takes 500 ms steps of 4096 tokens (+-3 % noise) for 300 s;
GPU, host and process samples are written as the daemon writes them (1 s GPU/host ticks, 5 s
process ticks). Each injection slows the steps in [SLOW_FROM, SLOW_TO) and writes its evidence.
"""

from __future__ import annotations

import random
from pathlib import Path

from gpuwatch.store import insert_rows, open_rw

T0 = 1_700_000_000_000
SECONDS = 300
SLOW_FROM, SLOW_TO = 120, 180
GIB = 1 << 30
MIB = 1 << 20


class Scenario:
    def __init__(
        self,
        seed: int = 1,
        seconds: int = SECONDS,
        window: tuple[int, int] = (SLOW_FROM, SLOW_TO),
        noise: float = 0.03,
        tokens: int | None = 4096,
        fold: int = 1,
        warmup_s: int = 0,
    ):
        self.seed = seed
        self.noise = noise
        self.tokens = tokens  # None: a run that records no tokens (speed is per step)
        self.fold = fold  # rows of this many steps each, as the client folds them past its budget
        self.warmup_s = warmup_s  # the first seconds at half speed (compilation, caches)
        self.window = window
        self.seconds = seconds
        self.factor: dict[str, float] = {"r": 1.0}  # slow-window step time factor per run
        self.runs = [
            dict(
                run_id="r",
                name="train",
                uid=1000,
                user="alice",
                pid=1000,
                status="finished",
                started_ms=T0,
                ended_ms=T0 + seconds * 1000,
                gpu_uuids="0",
                command="python train.py",
            )
        ]
        self.procs = [
            dict(
                pid=1000,
                start_ms=T0 - 1000,
                uid=1000,
                user="alice",
                cmdline="python train.py",
                run_id="r",
                first_seen_ms=T0,
                last_seen_ms=T0 + seconds * 1000,
            )
        ]
        self.gpu_of = {"r": 0}
        self.gpus = {0: []}
        self.host = []
        self.top = []
        self.gproc = []
        self.extra_rows: dict[str, list] = {}
        self.tokens_from: tuple[int, int] | None = None  # (second, tokens) a sequence-length change
        self.wait = False
        self.evals = False
        self.starts = {"r": 0}  # second each run starts at
        self.until = {"r": seconds}  # and stops at
        self.always: dict[str, float] = {}  # a step-time factor over a run's whole life
        for s in range(seconds):
            ts = T0 + s * 1000
            for gpu in (0, 1):
                self.gpus.setdefault(gpu, []).append(
                    dict(
                        gpu_index=gpu,
                        ts_ms=ts,
                        gpu_util_pct=95,
                        sm_clock_mhz=1980,
                        power_mw=400_000,
                        temp_c=60,
                        throttle_reasons=0,
                        mem_used_bytes=30 * GIB,
                    )
                )
            self.host.append(
                dict(
                    ts_ms=ts,
                    cpu_pct=30.0,
                    load1=2.0,
                    swap_in_bytes=10 * MIB,
                    swap_out_bytes=5 * MIB,
                    page_cache_bytes=40 * GIB,
                    shm_used_bytes=GIB,
                    shm_total_bytes=64 * GIB,
                    mem_total_bytes=256 * GIB,
                )
            )
            if s % 5 == 0:
                self.top += [
                    dict(
                        ts_ms=ts,
                        pid=1000,
                        start_ms=T0 - 1000,
                        uid=1000,
                        user="alice",
                        cmdline="python train.py",
                        cpu_pct=100.0,
                        rss_bytes=8 * GIB,
                    ),
                    dict(
                        ts_ms=ts,
                        pid=300,
                        start_ms=T0 - 10**7,
                        uid=0,
                        user="root",
                        cmdline="/usr/sbin/sshd",
                        cpu_pct=1.0,
                        rss_bytes=MIB * 10,
                    ),
                ]
                self.gproc.append(
                    dict(gpu_index=0, pid=1000, ts_ms=ts, used_mem_bytes=30 * GIB, sm_util_pct=90)
                )

    def in_window(self, s: int) -> bool:
        return self.window[0] <= s < self.window[1]

    def slow(self, factor: float, run: str = "r") -> None:
        self.factor[run] = self.factor.get(run, 1.0) * factor

    # ---- injections --------------------------------------------------------------------
    def cotenant(self, gpu: int = 0, pid: int = 8812, factor: float = 1.6) -> None:
        self.procs.append(
            dict(
                pid=pid,
                start_ms=T0 + self.window[0] * 1000 - 500,
                uid=1001,
                user="bob",
                cmdline="python other.py",
                first_seen_ms=T0 + self.window[0] * 1000,
                last_seen_ms=T0 + self.window[1] * 1000,
            )
        )
        for s in range(self.window[0], self.window[1], 5):
            self.gproc.append(
                dict(gpu_index=gpu, pid=pid, ts_ms=T0 + s * 1000, used_mem_bytes=10 * GIB, sm_util_pct=40)
            )
        self.slow(factor)

    def cpu_hog(self, pid: int = 7777, factor: float = 1.5) -> None:
        for row in self.host:
            if self.in_window((row["ts_ms"] - T0) // 1000):
                row["cpu_pct"] = 97.0
        for s in range(self.window[0], self.window[1], 5):
            self.top.append(
                dict(
                    ts_ms=T0 + s * 1000,
                    pid=pid,
                    start_ms=T0 + self.window[0] * 1000,
                    uid=1002,
                    user="carol",
                    cmdline="python preprocess.py",
                    cpu_pct=170.0,
                    rss_bytes=2 * GIB,
                )
            )
        self.slow(factor)

    def throttle(self, gpu: int = 0, factor: float = 1.4) -> None:
        for row in self.gpus[gpu]:
            if self.in_window((row["ts_ms"] - T0) // 1000):
                row.update(throttle_reasons=0x4, sm_clock_mhz=1410, power_mw=700_000, temp_c=83)
        self.slow(factor)

    def swapping(self, pid: int = 5555, factor: float = 1.5) -> None:
        swapped = 0
        for row in self.host:
            if self.in_window((row["ts_ms"] - T0) // 1000):
                swapped += 20 * MIB
                row["page_cache_bytes"] = 2 * GIB
            row["swap_in_bytes"] += swapped // 2
            row["swap_out_bytes"] += swapped // 2
        for s in range(self.window[0], self.window[1], 5):
            self.top.append(
                dict(
                    ts_ms=T0 + s * 1000,
                    pid=pid,
                    start_ms=T0 + self.window[0] * 1000,
                    uid=1003,
                    user="dave",
                    cmdline="python load_everything.py",
                    cpu_pct=20.0,
                    rss_bytes=200 * GIB,
                )
            )
        self.slow(factor)

    def data_loader_sleeps(self, factor: float = 1.6) -> None:
        self.wait = True
        self.slow(factor)

    def profiler_window(self, factor: float = 1.5) -> None:
        """The run's own scheduled profile over the window's steps (a traced step is slower)."""
        self.extra_rows.setdefault("profiles", []).append(
            dict(
                run_id="r",
                ts_ms=T0 + self.window[0] * 1000,
                trigger="scheduled",
                first_step=211,
                steps=80,
                trace_path="/tmp/trace.json",
            )
        )
        self.slow(factor)

    def sequence_length_doubles(self) -> None:
        self.tokens_from = (self.window[0], 8192)

    def evaluation_pauses(self) -> None:
        self.evals = True

    def second_rank(self, straggling_cotenant: bool) -> None:
        """A second rank r1 (pid 2000, GPU 1) of job j; both ranks slow together (DDP waits)."""
        self.runs[0].update(job_id="j", rank=0, world_size=2)
        self.runs.append(
            dict(
                run_id="r1",
                name="train",
                uid=1000,
                user="alice",
                pid=2000,
                status="finished",
                started_ms=T0,
                ended_ms=T0 + self.seconds * 1000,
                gpu_uuids="1",
                command="python train.py",
                job_id="j",
                rank=1,
                world_size=2,
            )
        )
        self.procs.append(
            dict(
                pid=2000,
                start_ms=T0 - 1000,
                uid=1000,
                user="alice",
                cmdline="python train.py",
                run_id="r1",
                first_seen_ms=T0,
                last_seen_ms=T0 + self.seconds * 1000,
            )
        )
        self.gpu_of["r1"] = 1
        for s in range(0, self.seconds, 5):
            self.gproc.append(
                dict(gpu_index=1, pid=2000, ts_ms=T0 + s * 1000, used_mem_bytes=30 * GIB, sm_util_pct=90)
            )
        if straggling_cotenant:
            self.cotenant(gpu=1, pid=9911, factor=1.5)
            self.factor["r1"] = self.factor["r"]

    def later_run_beside_a_cotenant(self, factor: float = 1.5) -> None:
        """Run "b" (pid 3000) on GPU 0 in the second half (seconds must be 600, run "r" stops at
        300), sharing it throughout with bob's pid 8813 (SM 40 %): steadily slower than "r"."""
        half = self.seconds // 2
        self.until["r"] = half
        self.runs[0]["ended_ms"] = T0 + half * 1000
        self.runs.append(
            dict(
                run_id="b",
                name="train-b",
                uid=1000,
                user="alice",
                pid=3000,
                status="finished",
                started_ms=T0 + half * 1000,
                ended_ms=T0 + self.seconds * 1000,
                gpu_uuids="0",
                command="python train.py",
            )
        )
        self.procs += [
            dict(
                pid=3000,
                start_ms=T0 + half * 1000,
                uid=1000,
                user="alice",
                cmdline="python train.py",
                run_id="b",
                first_seen_ms=T0 + half * 1000,
                last_seen_ms=T0 + self.seconds * 1000,
            ),
            dict(
                pid=8813,
                start_ms=T0 + half * 1000,
                uid=1001,
                user="bob",
                cmdline="python other.py",
                first_seen_ms=T0 + half * 1000,
                last_seen_ms=T0 + self.seconds * 1000,
            ),
        ]
        for s in range(half, self.seconds, 5):
            self.gproc += [
                dict(gpu_index=0, pid=3000, ts_ms=T0 + s * 1000, used_mem_bytes=30 * GIB, sm_util_pct=60),
                dict(gpu_index=0, pid=8813, ts_ms=T0 + s * 1000, used_mem_bytes=10 * GIB, sm_util_pct=40),
            ]
        self.starts["b"] = half
        self.always["b"] = factor

    # ---- writing -----------------------------------------------------------------------
    def _steps(self, run_id: str) -> list[dict]:
        rows, t, step = [], float(T0 + self.starts.get(run_id, 0) * 1000), 0
        rnd = random.Random(f"{self.seed}-{run_id}")
        while t < T0 + self.until.get(run_id, self.seconds) * 1000 - 1000:
            second = int((t - T0) // 1000)
            step += 1
            tokens = 4096
            base = 500.0 * rnd.uniform(1 - self.noise, 1 + self.noise)
            if self.tokens_from and second >= self.tokens_from[0]:
                tokens = self.tokens_from[1]
                base *= tokens / 4096
            ms = (
                base
                * (self.factor.get(run_id, 1.0) if self.in_window(second) else 1.0)
                * self.always.get(run_id, 1.0)
            )
            if second < self.warmup_s:
                ms *= 2
            wait = 2.0
            if self.wait and self.in_window(second):
                wait = (ms - base * 0.98) / ms * 100
            if self.evals and step % 100 == 0:
                ms += 20_000  # an evaluation between two steps
            if step == 1:
                ms += 15_000  # compilation
            t += ms
            rows.append(
                dict(
                    run_id=run_id,
                    step=step,
                    ts_ms=int(t),
                    tokens=tokens if self.tokens else None,
                    step_time_ms=ms,
                    data_wait_pct=wait,
                    tokens_per_s=tokens / ms * 1000,
                    loss=2.0,
                )
            )
        return self._folded(rows) if self.fold > 1 else rows

    def _folded(self, rows: list[dict]) -> list[dict]:
        """One row per `fold` steps: the last step and time, summed tokens, mean step time and wait."""
        out = []
        for k in range(0, len(rows), self.fold):
            part = rows[k : k + self.fold]
            n = len(part)
            out.append(
                dict(
                    part[-1],
                    n_steps=n,
                    tokens=sum(r["tokens"] for r in part) if self.tokens else None,
                    step_time_ms=sum(r["step_time_ms"] for r in part) / n,
                    data_wait_pct=sum(r["data_wait_pct"] for r in part) / n,
                )
            )
        return out

    def write(self, path: Path) -> Path:
        conn = open_rw(path)
        conn.execute("BEGIN")
        insert_rows(
            conn,
            "gpus",
            [
                dict(
                    gpu_index=i,
                    uuid=f"GPU-{i}",
                    name="NVIDIA H100 (simulated)",
                    power_limit_mw=700_000,
                    first_seen_ms=T0,
                    last_seen_ms=T0 + 10**6,
                )
                for i in (0, 1)
            ],
        )
        insert_rows(conn, "runs", self.runs)
        insert_rows(conn, "processes", self.procs)
        for run in self.runs:
            insert_rows(conn, "steps", self._steps(run["run_id"]))
        insert_rows(conn, "gpu_samples", [r for rows in self.gpus.values() for r in rows])
        insert_rows(conn, "host_samples", self.host)
        insert_rows(conn, "host_top_processes", self.top)
        insert_rows(conn, "gpu_process_samples", self.gproc)
        for table, rows in self.extra_rows.items():
            insert_rows(conn, table, rows)
        conn.execute("COMMIT")
        conn.close()
        return path
