"""Largest sequence length before running out of memory: measure small, fit, predict, check.

For each batch size the workload runs a couple of steps at increasing lengths (appending
`--seq-len L --batch B --steps 2`) and reports its peak memory on its GPUWATCH_RESULT line
(CUDA allocator peak on a GPU, peak RSS on a CPU). peak(L) = a + b*L + c*L^2 is fitted by least
squares (attention scores grow with L^2, activations with L, weights and the runtime are the
constant); the largest L whose fitted peak stays under limit x (1 - margin) is the prediction,
never beyond a length that already ran out of memory; a run at that length checks it.
Pure stdlib: the CLI path imports neither numpy nor torch.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from gpuwatch.store import insert_rows, now_ms, open_rw

RESULT_PREFIX = "GPUWATCH_RESULT "
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Lengths are rounded down to a multiple of this: kernels and users like round numbers.
ROUND_TO = 8

DEVICE_PROBE = """
import json, torch
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(json.dumps({"device": p.name, "total_bytes": p.total_memory}))
else:
    print(json.dumps({"device": "cpu"}))
"""


class CapacityError(RuntimeError):
    """The study cannot go on; one line saying why."""


def parse_size(text: str) -> int:
    """'8GiB', '512M', '1.5G', '1000000' -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size like 8GiB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNIT[m.group(2).upper()])


def parse_ints(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or values[0] <= 0:
        raise ValueError(f"{text!r}: give positive integers, e.g. 128,256,512")
    return values


@dataclass(frozen=True)
class Point:
    batch: int
    seq_len: int
    peak_bytes: int | None
    ok: bool  # False: this point ran out of memory
    kind: str = "measured"  # measured | verify


@dataclass(frozen=True)
class Fit:
    """peak(L) = a + b*L + c*L^2 bytes."""

    a: float
    b: float
    c: float

    def peak(self, seq_len: float) -> float:
        return self.a + self.b * seq_len + self.c * seq_len * seq_len

    def max_len(self, budget: float) -> int | None:
        """Largest L >= 1 with peak(L) <= budget; None if not even L = 1 fits."""
        if self.peak(1) > budget:
            return None
        if self.c > 0:
            disc = self.b * self.b - 4 * self.c * (self.a - budget)
            root = (-self.b + math.sqrt(max(disc, 0.0))) / (2 * self.c)
        elif self.b > 0:
            root = (budget - self.a) / self.b
        else:
            return None  # memory does not grow with L: the fit cannot bound it
        return max(int(root), 1)


def fit_quadratic(points: Sequence[tuple[float, float]]) -> Fit:
    """Least-squares a + b*L + c*L^2 through (L, peak); a line through two points, or when the
    best parabola bends down (memory never shrinks as L grows: that is measurement noise)."""
    if len(points) < 2:
        raise CapacityError("need at least two lengths that fit in memory to fit a curve")
    if len({x for x, _ in points}) >= 3:
        fit = _least_squares(points, 2)
        if fit.c >= 0:
            return fit
    return _least_squares(points, 1)


def _least_squares(points: Sequence[tuple[float, float]], degree: int) -> Fit:
    scale = max(x for x, _ in points)  # solve in L/scale: keeps the normal equations well conditioned
    n = degree + 1
    # Normal equations: sum x^(i+j) * coef_j = sum y * x^i.
    m = [
        [sum((x / scale) ** (i + j) for x, _ in points) for j in range(n)]
        + [sum(y * (x / scale) ** i for x, y in points)]
        for i in range(n)
    ]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            raise CapacityError("the measured lengths do not determine a curve (all the same?)")
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col])]
    coef = [m[i][n] / m[i][i] for i in range(n)] + [0.0] * (3 - n)
    return Fit(coef[0], coef[1] / scale, coef[2] / (scale * scale))


def run_point(
    command: Sequence[str],
    batch: int,
    seq_len: int,
    kind: str = "measured",
    env: dict | None = None,
    timeout: float = 3600.0,
) -> Point:
    """Run the workload once at (batch, seq_len) and read its peak from the GPUWATCH_RESULT line."""
    argv = [*command, "--seq-len", str(seq_len), "--batch", str(batch), "--steps", "2"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise CapacityError(f"cannot run {command[0]!r}: not found") from None
    except subprocess.TimeoutExpired:
        raise CapacityError(f"batch {batch} seq_len {seq_len}: no result in {timeout:.0f}s") from None
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            break
    if result is None:
        if proc.returncode < 0 or proc.returncode == 137:  # killed, e.g. by the kernel's OOM killer
            return Point(batch, seq_len, None, False, kind)
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise CapacityError(
            f"batch {batch} seq_len {seq_len}: no {RESULT_PREFIX.strip()} line "
            f"in the workload's output ({last})"
        )
    return Point(batch, seq_len, result.get("peak_bytes"), not result.get("oom"), kind)


def probe_device(command: Sequence[str]) -> dict:
    """The device the workload will use and its memory: the first CUDA device unless the
    command says --device cpu; a CPU's budget is decided by the caller."""
    if "cpu" in _device_flag(command):
        return {"device": "cpu"}
    proc = subprocess.run([sys.executable, "-c", DEVICE_PROBE], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"device": "cpu"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _device_flag(command: Sequence[str]) -> str:
    for i, arg in enumerate(command):
        if arg == "--device" and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return ""


def cpu_env() -> dict:
    """The environment for CPU points. glibc raises its mmap threshold after big frees, after
    which big tensors come from the heap and peak RSS drifts with fragmentation; a fixed
    threshold returns every big tensor to the system when freed, so peak RSS tracks live tensors."""
    return {"MALLOC_MMAP_THRESHOLD_": "65536", **os.environ}


def cpu_limit_bytes() -> int:
    """What a CPU run may use: the cgroup's memory limit if there is one, else available memory."""
    import psutil

    from collectors.host import cgroup_memory_limit_bytes

    available = psutil.virtual_memory().available
    limit = cgroup_memory_limit_bytes()
    return min(limit, available) if limit else available


@dataclass
class Study:
    command: list[str]
    device: str
    limit_bytes: int
    margin: float
    points: list[Point] = field(default_factory=list)
    fits: dict[int, Fit] = field(default_factory=dict)
    predicted: dict[int, dict] = field(default_factory=dict)  # batch -> max_seq_len, peaks
    notes: list[str] = field(default_factory=list)

    @property
    def budget_bytes(self) -> float:
        return self.limit_bytes * (1.0 - self.margin)


def run_study(
    command: Sequence[str],
    batches: Sequence[int],
    lengths: Sequence[int],
    margin: float,
    limit_bytes: int | None = None,
    verify: bool = True,
    progress: Callable[[str], None] = lambda what: None,
) -> Study:
    """Measure every (batch, length) until a length runs out of memory, fit, predict, verify."""
    info = probe_device(command)
    if limit_bytes is None:
        limit_bytes = info.get("total_bytes") or cpu_limit_bytes()
    study = Study(list(command), info["device"], int(limit_bytes), margin)
    env = cpu_env() if study.device == "cpu" else None
    for batch in batches:
        oom_at = None
        for seq_len in lengths:
            progress(f"batch {batch}, seq_len {seq_len}")
            point = run_point(command, batch, seq_len, env=env)
            study.points.append(point)
            if not point.ok:
                oom_at = seq_len
                break  # longer ones would run out of memory too
        ok = [
            (p.seq_len, p.peak_bytes)
            for p in study.points
            if p.batch == batch and p.ok and p.peak_bytes is not None
        ]
        try:
            fit = fit_quadratic(ok)
        except CapacityError as e:
            study.notes.append(f"batch {batch}: {e}")
            continue
        study.fits[batch] = fit
        best = fit.max_len(study.budget_bytes)
        if best is None:
            study.notes.append(f"batch {batch}: nothing fits in the budget according to the fit")
            continue
        if oom_at is not None and best >= oom_at:
            best = oom_at - 1  # a measured OOM overrules the fit
        best = max(best // ROUND_TO * ROUND_TO, min(best, ROUND_TO))
        pred = {"max_seq_len": best, "predicted_peak_bytes": int(fit.peak(best)), "verified_peak_bytes": None}
        if verify:
            progress(f"batch {batch}, seq_len {best} (check)")
            check = run_point(command, batch, best, kind="verify", env=env)
            study.points.append(check)
            pred["verified_peak_bytes"] = check.peak_bytes
            pred["verified_ok"] = check.ok
        study.predicted[batch] = pred
    return study


def save_study(db_path, study: Study, uid: int | None = None) -> int:
    """Store the study and its points; returns the study id."""
    conn = open_rw(db_path)
    try:
        with conn:
            cur = conn.execute(
                "INSERT INTO capacity_studies (ts_ms, uid, command, device, limit_bytes, margin, fit_json, "
                "predicted_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now_ms(),
                    os.getuid() if uid is None else uid,
                    " ".join(study.command),
                    study.device,
                    study.limit_bytes,
                    study.margin,
                    json.dumps({str(b): asdict(f) for b, f in study.fits.items()}),
                    json.dumps({str(b): p for b, p in study.predicted.items()}),
                ),
            )
            study_id = cur.lastrowid
            insert_rows(
                conn,
                "capacity_points",
                [
                    {
                        "study_id": study_id,
                        "batch": p.batch,
                        "seq_len": p.seq_len,
                        "peak_bytes": p.peak_bytes,
                        "ok": int(p.ok),
                        "kind": p.kind,
                    }
                    for p in study.points
                ],
                "REPLACE",
            )
    finally:
        conn.close()
    return study_id
