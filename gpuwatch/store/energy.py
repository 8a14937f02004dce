"""Energy per run: each GPU's NVML energy counter (gpu_samples.energy_mj), shared among the runs
whose processes were on that GPU.

The rule (README, "Energy per run"):
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
from typing import Iterable, Mapping

from gpuwatch.store.packed import between
from gpuwatch.store.queries import PROCESS_TICK_SLACK_MS

MAX_GAP_MS = 5 * 60_000
OPEN = float("inf")  # a running run's end


@dataclass(frozen=True)
class RunEnergy:
    run_id: str
    joules: float
    gpus: tuple[int, ...]     # the GPUs it drew energy on
    from_ms: int              # counted from here: the run's start, unless older samples are gone
    complete: bool            # False: raw samples of the run's start had expired

    @property
    def kwh(self) -> float:
        return self.joules / 3.6e6


class EnergyLedger:
    """Joules per run from `since_ms` on, folded in by successive fold() calls."""

    def __init__(self, since_ms: int) -> None:
        self.until_ms = since_ms
        self.joules: dict[str, float] = defaultdict(float)
        self.gpus_of: dict[str, set[int]] = defaultdict(set)
        self.first_reading: dict[int, int] = {}        # gpu -> its first counter reading's ts_ms
        self._last: dict[int, tuple[int, int]] = {}    # gpu -> (ts_ms, mJ) of its newest reading
        self._ticks: list[tuple[int, dict[int, tuple[int, ...]]]] = []  # (ts_ms, gpu -> pids)
        self._owners: dict[int, list[tuple[str, int, float]]] = {}      # pid -> (run, start, end)

    def fold(self, conn: sqlite3.Connection, until_ms: int, runs: Iterable[str] | None = None) -> None:
        """Fold in the samples with until_ms (as last folded) <= ts_ms < until_ms. `runs`: only the
        GPUs where one of these runs' processes appear are read (others' energy is not wanted)."""
        since = self.until_ms
        if until_ms <= since:
            return
        self._read_ticks(conn, since, until_ms)
        gpus = None
        if runs is not None:
            wanted = set(runs)
            gpus = sorted({g for _, on in self._ticks for g, pids in on.items()
                           if any(o[0] in wanted for p in pids for o in self._owners.get(p, ()))})
            if not gpus:
                self.until_ms = until_ms
                return
        samples = between("gpu_samples", since, until_ms, columns=("gpu_index", "energy_mj"))
        only = "" if gpus is None else f" AND gpu_index IN ({','.join(map(str, gpus))})"
        rows = sorted(conn.execute(f"SELECT gpu_index, ts_ms, energy_mj FROM {samples} "
                                   f"WHERE energy_mj IS NOT NULL{only}"))
        for gpu, ts, mj in rows:
            self.first_reading.setdefault(gpu, ts)
            last = self._last.get(gpu)
            self._last[gpu] = (ts, mj)
            if last is None or ts <= last[0]:
                continue
            if mj < last[1] or ts - last[0] > MAX_GAP_MS:
                continue  # a reset counter or a long gap: unknown, nobody's
            self._share(gpu, last[0], ts, (mj - last[1]) / 1000.0)
        self.until_ms = until_ms
        self._forget_before(until_ms - MAX_GAP_MS - PROCESS_TICK_SLACK_MS)

    def energy(self, run_id: str, start_ms: int) -> RunEnergy | None:
        """What was folded for the run; None when it drew nothing we saw."""
        gpus = self.gpus_of.get(run_id)
        if not gpus:
            return None
        first = max(self.first_reading.get(g, start_ms) for g in gpus)
        return RunEnergy(run_id, self.joules[run_id], tuple(sorted(gpus)), max(first, start_ms),
                         first <= start_ms + PROCESS_TICK_SLACK_MS)

    # -- internals --------------------------------------------------------------------------

    def _read_ticks(self, conn: sqlite3.Connection, since: int, until: int) -> None:
        # The first fold also needs the tick in effect at its start.
        start = since - PROCESS_TICK_SLACK_MS if not self._ticks else since
        samples = between("gpu_process_samples", start, until, columns=("gpu_index", "pid"))
        by_ts: dict[int, dict[int, list[int]]] = {}
        for ts, gpu, pid in conn.execute(f"SELECT ts_ms, gpu_index, pid FROM {samples}"):
            by_ts.setdefault(ts, {}).setdefault(gpu, []).append(pid)
        for ts in sorted(by_ts):
            if not self._ticks or ts > self._ticks[-1][0]:
                self._ticks.append((ts, {g: tuple(p) for g, p in by_ts[ts].items()}))
        pids = {p for _, on in self._ticks for ps in on.values() for p in ps}
        self._owners = _owners(conn, pids)

    def _forget_before(self, cutoff_ms: int) -> None:
        """Keep the tick in effect at cutoff_ms and every newer one."""
        keep = max(0, bisect_right(self._ticks, cutoff_ms, key=lambda t: t[0]) - 1)
        del self._ticks[:keep]

    def _share(self, gpu: int, t0: int, t1: int, joules: float) -> None:
        per_ms = joules / (t1 - t0)
        k = bisect_right(self._ticks, t0, key=lambda t: t[0]) - 1
        a = t0
        while a < t1:
            nxt = self._ticks[k + 1][0] if k + 1 < len(self._ticks) else t1
            b = min(t1, nxt)
            if k >= 0:
                ts, on = self._ticks[k]
                pids = on.get(gpu, ())
                end = min(b, ts + PROCESS_TICK_SLACK_MS)
                if pids and a < end:
                    for pid in pids:
                        self._credit(gpu, pid, a, end, per_ms / len(pids))
            a = b
            k += 1

    def _credit(self, gpu: int, pid: int, a: int, b: int, per_ms: float) -> None:
        """[a, b) of a process's share to the run it belonged to then (newest first)."""
        pieces = [(a, b)]
        for run_id, start, end in self._owners.get(pid, ()):
            rest = []
            for x, y in pieces:
                lo, hi = max(x, start), min(y, end)
                if lo < hi:
                    self.joules[run_id] += per_ms * (hi - lo)
                    self.gpus_of[run_id].add(gpu)
                    rest += [p for p in ((x, lo), (hi, y)) if p[0] < p[1]]
                else:
                    rest.append((x, y))
            pieces = rest
            if not pieces:
                return


def _owners(conn: sqlite3.Connection, pids: set[int]) -> dict[int, list[tuple[str, int, float]]]:
    """pid -> the runs it may belong to, (run_id, started_ms, ended_ms or OPEN), newest first."""
    if not pids:
        return {}
    marks = ",".join(map(str, sorted(pids)))
    rows = conn.execute(
        f"SELECT p.pid, r.run_id, r.started_ms, r.ended_ms FROM processes p JOIN runs r "
        f"ON r.run_id = p.run_id WHERE p.pid IN ({marks}) "
        f"UNION SELECT pid, run_id, started_ms, ended_ms FROM runs WHERE pid IN ({marks})").fetchall()
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
