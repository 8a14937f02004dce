"""Energy per run: each GPU's NVML energy counter (gpu_samples.energy_mj), shared among the runs
whose processes were on that GPU.

The rule (docs/analysis.md, "Energy per run"):
- Between two consecutive samples of a GPU that both read the counter, the GPU used their
  difference, spread evenly over that interval. A counter that went down (driver reload, GPU
  reset) or a gap longer than MAX_GAP_MS (daemon stopped, GPU lost) leaves that interval
  unattributed: its energy is unknown, never negative or guessed. A sample without a reading
  is skipped; the counter still gives the exact energy across it.
- At each instant that energy goes in equal shares to the processes on the GPU in the process
  tick in effect (the newest at or before it, no older than PROCESS_TICK_SLACK_MS; a GPU absent
  from a tick has none). A process's share is its run's while that run runs (started_ms to
  ended_ms); a process of no run, and a GPU with no process, are nobody's.
- A process belongs to the runs its `processes` rows name, or whose pid it is; of those, the
  newest one running at that instant.

An EnergyLedger folds samples in time order and keeps what it needs to go on, so /metrics adds
only the seconds since its last scrape; run_energy() folds a run's lifetime once.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from gpuwatch.store.queries import PROCESS_TICK_SLACK_MS, every_gpu


def between(table: str, since_ms: int, until_ms: int) -> str:
    """A FROM item: the table's samples with since <= ts_ms < until, each GPU's range sought
    through the (gpu_index, ts_ms) key."""
    return (
        f"(SELECT * FROM {table} WHERE gpu_index IN {every_gpu(table)} "
        f"AND ts_ms >= {int(since_ms)} AND ts_ms < {int(until_ms)}) AS {table}"
    )


MAX_GAP_MS = 5 * 60_000
FOLD_PIECE_MS = 3_600_000
OPEN = float("inf")  # a running run's end


@dataclass(frozen=True)
class RunEnergy:
    run_id: str
    joules: float
    gpus: tuple[int, ...]  # the GPUs it drew energy on
    from_ms: int  # counted from here: the run's start, unless older samples are gone
    complete: bool  # False: raw samples of the run's start had expired

    @property
    def kwh(self) -> float:
        return self.joules / 3.6e6


class EnergyLedger:
    """Joules per run from `since_ms` on, folded in by successive fold() calls."""

    def __init__(self, since_ms: int) -> None:
        self.until_ms = since_ms
        self.joules: dict[str, float] = defaultdict(float)
        self.gpus_of: dict[str, set[int]] = defaultdict(set)
        self.first_reading: dict[int, int] = {}  # gpu -> its first counter reading's ts_ms
        self._last: dict[int, tuple[int, int]] = {}  # gpu -> (ts_ms, mJ) of its newest reading
        self._tick_ts: list[int] = []  # process ticks, oldest first...
        self._tick_on: list[dict[int, tuple[int, ...]]] = []  # ...and gpu -> pids in each
        self._owners: dict[int, list[tuple[str, int, float]]] = {}  # pid -> (run, start, end)
        # Within one fold: who owns each tick's processes, and for how long that holds, and the
        # joules of each (gpu, owners) summed before they are split (a fold's many intervals
        # would otherwise each split again among the same runs).
        self._resolved: dict[tuple[int, int], tuple[float, float, tuple[str | None, ...]]] = {}
        self._pending: dict[tuple[int, tuple[str | None, ...]], float] = defaultdict(float)
        self._wanted_gpus: set[int] = set()  # fold(runs=...): the GPUs those runs used so far

    def fold(self, conn: sqlite3.Connection, until_ms: int, runs: Iterable[str] | None = None) -> None:
        """Fold in the samples with until_ms (as last folded) <= ts_ms < until_ms. `runs`: only the
        GPUs where one of these runs' processes appear are read (others' energy is not wanted).
        A long range is read FOLD_PIECE_MS at a time: a day of 8 GPUs is never in memory at once."""
        runs = None if runs is None else list(runs)
        while self.until_ms < until_ms:
            following = _next_sample_ms(conn, self.until_ms)
            if following is None or following >= until_ms:
                self._fold_piece(conn, until_ms, runs)  # nothing to read before until_ms
            elif following > self.until_ms + FOLD_PIECE_MS:
                self.until_ms = following  # a stretch without samples: a run from before them
            else:
                self._fold_piece(conn, min(until_ms, self.until_ms + FOLD_PIECE_MS), runs)

    def _fold_piece(self, conn: sqlite3.Connection, until_ms: int, runs: list[str] | None) -> None:
        since = self.until_ms
        start = since if self._tick_ts else since - PROCESS_TICK_SLACK_MS  # the tick in effect at since
        gpus = None
        if runs is not None:  # the GPUs seen so far too: a short fold may hold no tick of theirs
            self._wanted_gpus.update(_gpus_of(conn, runs, start, until_ms))
            gpus = sorted(self._wanted_gpus)
        if gpus == []:
            self.until_ms = until_ms
            return
        self._read_ticks(conn, start, until_ms, gpus)
        samples = between("gpu_samples", since, until_ms)
        only = "" if gpus is None else f" AND gpu_index IN ({','.join(map(str, gpus))})"
        rows = sorted(
            conn.execute(
                f"SELECT gpu_index, ts_ms, energy_mj FROM {samples} WHERE energy_mj IS NOT NULL{only}"
            )
        )
        for gpu, ts, mj in rows:
            self.first_reading.setdefault(gpu, ts)
            last = self._last.get(gpu)
            self._last[gpu] = (ts, mj)
            if last is None or ts <= last[0]:
                continue
            if mj < last[1] or ts - last[0] > MAX_GAP_MS:
                continue  # a reset counter or a long gap: unknown, nobody's
            self._share(gpu, last[0], ts, (mj - last[1]) / 1000.0)
        for (gpu, owners), joules in self._pending.items():
            for run_id in owners:
                if run_id is not None:
                    self.joules[run_id] += joules / len(owners)
                    self.gpus_of[run_id].add(gpu)
        self._pending.clear()
        self._resolved.clear()
        self.until_ms = until_ms
        self._forget_before(until_ms - MAX_GAP_MS - PROCESS_TICK_SLACK_MS)

    def energy(self, run_id: str, start_ms: int) -> RunEnergy | None:
        """What was folded for the run; None when it drew nothing we saw."""
        gpus = self.gpus_of.get(run_id)
        if not gpus:
            return None
        first = max(self.first_reading.get(g, start_ms) for g in gpus)
        return RunEnergy(
            run_id,
            self.joules[run_id],
            tuple(sorted(gpus)),
            max(first, start_ms),
            first <= start_ms + PROCESS_TICK_SLACK_MS,
        )

    # -- internals --------------------------------------------------------------------------

    def _read_ticks(self, conn: sqlite3.Connection, since: int, until: int, gpus: list[int] | None) -> None:
        """Append the process ticks in [since, until): with `gpus`, those GPUs' processes, and
        every tick's time (a GPU absent from a tick had no process then)."""
        only = "" if gpus is None else f" WHERE gpu_index IN ({','.join(map(str, gpus))})"
        samples = between("gpu_process_samples", since, until)
        by_ts: dict[int, dict[int, list[int]]] = defaultdict(dict)
        for ts, gpu, pid in conn.execute(f"SELECT ts_ms, gpu_index, pid FROM {samples}{only}"):
            by_ts[ts].setdefault(gpu, []).append(pid)
        if gpus is not None:
            times = between("gpu_process_samples", since, until)
            for (ts,) in conn.execute(f"SELECT DISTINCT ts_ms FROM {times}"):
                by_ts[ts]  # noqa: B018 (a tick where the wanted GPUs had no process)
        newest = self._tick_ts[-1] if self._tick_ts else None
        for ts in sorted(by_ts):
            if newest is None or ts > newest:
                self._tick_ts.append(ts)
                self._tick_on.append({g: tuple(p) for g, p in by_ts[ts].items()})
        self._owners = _owners(conn, {p for on in self._tick_on for ps in on.values() for p in ps})

    def _forget_before(self, cutoff_ms: int) -> None:
        """Keep the tick in effect at cutoff_ms and every newer one."""
        keep = max(0, bisect_right(self._tick_ts, cutoff_ms) - 1)
        del self._tick_ts[:keep], self._tick_on[:keep]

    def _share(self, gpu: int, t0: int, t1: int, joules: float) -> None:
        """Energy over [t0, t1), evenly in time, to the processes of each tick in effect."""
        per_ms = joules / (t1 - t0)
        k = bisect_right(self._tick_ts, t0) - 1
        a = t0
        while a < t1:
            b = min(t1, self._tick_ts[k + 1]) if k + 1 < len(self._tick_ts) else t1
            if k >= 0:
                ts = self._tick_ts[k]
                pids = self._tick_on[k].get(gpu)
                end = min(b, ts + PROCESS_TICK_SLACK_MS)
                while pids and a < end:  # split where the processes' runs start or end
                    known = self._resolved.get((ts, gpu))
                    if known is not None and known[0] <= a < known[1]:
                        hi, owners = known[1], known[2]
                    else:
                        hi, owners = self._owners_at(ts, gpu, pids, a)
                    upto = int(min(end, hi))  # hi is an int, or OPEN (inf) past end
                    self._pending[gpu, owners] += per_ms * (upto - a)
                    a = upto
            a = b
            k += 1

    def _owners_at(self, ts: int, gpu: int, pids: tuple[int, ...], at: int) -> tuple[float, tuple[Any, ...]]:
        """The run of each process at `at` (newest started first; None: no run), and until
        when that holds (the next start or end of one of their runs); kept for the next call."""
        lo, hi = -OPEN, OPEN
        owners: list[str | None] = []
        for pid in pids:
            owner = None
            for run_id, start, end in self._owners.get(pid, ()):
                lo = max([lo] + [x for x in (start, end) if x <= at])
                hi = min([hi] + [x for x in (start, end) if x > at])
                if owner is None and start <= at < end:
                    owner = run_id
            owners.append(owner)
        self._resolved[ts, gpu] = (lo, hi, tuple(owners))
        return hi, tuple(owners)


def _next_sample_ms(conn: sqlite3.Connection, since_ms: int) -> int | None:
    """The first GPU or GPU-process sample at or after since_ms (a seek per GPU), or None."""
    found = [
        conn.execute(
            f"SELECT min(ts_ms) FROM {table} WHERE gpu_index IN {every_gpu(table)} AND ts_ms >= ?",
            (since_ms,),
        ).fetchone()[0]
        for table in ("gpu_samples", "gpu_process_samples")
    ]
    found = [t for t in found if t is not None]
    return min(found) if found else None


def _gpus_of(conn: sqlite3.Connection, runs: list[str], since: int, until: int) -> list[int]:
    """GPUs where a process of one of these runs (by `processes` or the run's pid) was seen."""
    marks = ",".join("?" * len(runs))
    pids = [
        p
        for (p,) in conn.execute(
            f"SELECT pid FROM processes WHERE run_id IN ({marks}) UNION "
            f"SELECT pid FROM runs WHERE run_id IN ({marks}) AND pid IS NOT NULL",
            runs + runs,
        )
    ]
    if not pids:
        return []
    samples = between("gpu_process_samples", since, until)
    return [
        g
        for (g,) in conn.execute(
            f"SELECT DISTINCT gpu_index FROM {samples} WHERE pid IN ({','.join(map(str, pids))}) ORDER BY 1"
        )
    ]


def _owners(conn: sqlite3.Connection, pids: set[int]) -> dict[int, list[tuple[str, int, float]]]:
    """pid -> the runs it may belong to, (run_id, started_ms, ended_ms or OPEN), newest first."""
    if not pids:
        return {}
    marks = ",".join(map(str, sorted(pids)))
    rows = conn.execute(
        f"SELECT p.pid, r.run_id, r.started_ms, r.ended_ms FROM processes p JOIN runs r "
        f"ON r.run_id = p.run_id WHERE p.pid IN ({marks}) "
        f"UNION SELECT pid, run_id, started_ms, ended_ms FROM runs WHERE pid IN ({marks})"
    ).fetchall()
    out: dict[int, list[tuple[str, int, float]]] = defaultdict(list)
    for pid, run_id, started, ended in sorted(rows, key=lambda r: -r[2]):
        out[pid].append((run_id, started, OPEN if ended is None else ended))
    return out


def run_energy(conn: sqlite3.Connection, windows: Mapping[str, tuple[int, int]]) -> dict[str, RunEnergy]:
    """Energy of each run over its window (run_id -> (start_ms, end_ms)), in one pass over the
    samples of their union; a run with no energy seen is left out."""
    found: dict[str, RunEnergy] = {}
    for group in _overlapping(windows):  # runs far apart in time: not the days between them
        start = min(windows[r][0] for r in group)
        ledger = EnergyLedger(start - PROCESS_TICK_SLACK_MS)
        ledger.fold(conn, max(windows[r][1] for r in group) + 1, runs=group)
        for run_id in group:
            energy = ledger.energy(run_id, windows[run_id][0])
            if energy is not None:
                found[run_id] = energy
    return found


def _overlapping(windows: Mapping[str, tuple[int, int]]) -> list[list[str]]:
    groups: list[list[str]] = []
    end = None
    for run_id, (s, e) in sorted(windows.items(), key=lambda kv: kv[1]):
        if end is None or s > end:
            groups.append([])
            end = e
        groups[-1].append(run_id)
        end = max(end, e)
    return groups
