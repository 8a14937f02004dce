"""NVML as gpuwatch reads it vs nvidia-smi, read one right after the other."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time

from gpuwatch.selftest.result import FAIL, OK, SKIPPED, Result, within

MiB = 2**20
# nvidia-smi field -> (our figure from a GpuSample / GpuStatic / persistence, converted to
# nvidia-smi's unit; allowed difference given nvidia-smi's value; tolerance as stated).
# Memory used, utilisation, power and clocks move between the two reads: their tolerances say how much.
FIELDS = {
    "memory.total": (lambda s, g, p: _div(g.mem_total_bytes, MiB), lambda v: 1, "1 MiB"),
    "memory.used": (
        lambda s, g, p: _div(s.mem_used_bytes, MiB),
        lambda v: max(256, 0.02 * v),
        "256 MiB or 2 %",
    ),
    "utilization.gpu": (lambda s, g, p: s.gpu_util_pct, lambda v: 15, "15 points"),
    "temperature.gpu": (lambda s, g, p: s.temp_c, lambda v: 3, "3 °C"),
    "power.draw": (lambda s, g, p: _div(s.power_mw, 1000), lambda v: max(15, 0.1 * v), "15 W or 10 %"),
    "clocks.sm": (lambda s, g, p: s.sm_clock_mhz, lambda v: max(100, 0.1 * v), "100 MHz or 10 %"),
    "clocks.mem": (lambda s, g, p: s.mem_clock_mhz, lambda v: max(50, 0.05 * v), "50 MHz or 5 %"),
    "persistence_mode": (lambda s, g, p: p, lambda v: 0, "exact"),
    "mig.mode.current": (lambda s, g, p: g.mig_mode, lambda v: 0, "exact"),
}
QUERY = ["uuid", *FIELDS]
_WORDS = {"enabled": 1, "disabled": 0}
TICK_BUDGET_MS = 100.0  # a 1 s interval leaves room, but a tick should not be a tenth of it


def _div(value, by):
    return None if value is None else value / by


def parse_csv(text: str, fields: list[str]) -> list[dict]:
    """Rows of `nvidia-smi --query-…=a,b --format=csv,noheader,nounits` as dicts of numbers;
    [N/A] / [Not Supported] become None, Enabled / Disabled 1 / 0, text stays text."""
    rows = []
    for cells in csv.reader(io.StringIO(text)):
        if not cells:
            continue
        rows.append({f: _value(c.strip()) for f, c in zip(fields, cells)})
    return rows


def _value(cell: str):
    if cell.startswith("["):
        return None
    if cell.lower() in _WORDS:
        return _WORDS[cell.lower()]
    try:
        return float(cell)
    except ValueError:
        return cell


def query(kind: str, fields: list[str], smi: str = "nvidia-smi") -> list[dict]:
    out = subprocess.run(
        [smi, f"--query-{kind}={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return parse_csv(out, fields)


def compare(samples, statics, persistence: dict, smi_rows: list[dict]) -> list[Result]:
    """One result per GPU and field: gpuwatch's sample vs nvidia-smi's row with the same UUID."""
    by_uuid = {g.uuid: (g, s) for g, s in zip(statics, samples)}
    results = []
    for row in smi_rows:
        found = by_uuid.get(row["uuid"])
        if found is None:
            results.append(Result(f"GPU {row['uuid']}", FAIL, "nvidia-smi lists it, gpuwatch does not"))
            continue
        static, sample = found
        for field, (ours, allowed, tolerance) in FIELDS.items():
            theirs = row.get(field)
            results.append(
                within(
                    f"GPU {static.gpu_index} {field}",
                    ours(sample, static, persistence.get(static.gpu_index)),
                    theirs,
                    allowed(theirs or 0),
                    tolerance=tolerance,
                )
            )
    return results


def check_gpus() -> list[Result]:
    from collectors.nvml import NvmlCollector, NvmlUnavailable

    smi = shutil.which("nvidia-smi")
    try:
        collector = NvmlCollector()
    except NvmlUnavailable as e:
        return [Result("NVML vs nvidia-smi", SKIPPED, f"no NVIDIA driver here ({e})")]
    try:
        if smi is None:
            return [Result("NVML vs nvidia-smi", SKIPPED, "nvidia-smi is not on PATH")]
        samples, _ = collector.sample(int(time.time() * 1000))
        persistence = {g.gpu_index: collector.persistence_mode(g.gpu_index) for g in collector.static}
        return compare(samples, collector.static, persistence, query("gpu", QUERY, smi))
    finally:
        collector.close()


def tick_verdict(tick_ms: float, pcie_ms: float, pcie_every: int, gpus: int) -> Result:
    """The sampler's GPU tick on this driver, and where the PCIe reads went."""
    where = "read every tick" if pcie_every == 1 else f"moved to every {pcie_every}th tick (they were slow)"
    return Result(
        f"GPU tick cost ({gpus} GPUs)",
        OK if tick_ms <= TICK_BUDGET_MS else FAIL,
        f"{tick_ms:.1f} ms per tick, PCIe reads {pcie_ms:.1f} ms of it, {where}",
        f"<= {TICK_BUDGET_MS:.0f} ms",
    )


def check_tick_cost(ticks: int = 5) -> list[Result]:
    from collectors.nvml import NvmlCollector, NvmlUnavailable

    try:
        collector = NvmlCollector()
    except NvmlUnavailable as e:
        return [Result("GPU tick cost", SKIPPED, f"no NVIDIA driver here ({e})")]
    try:
        first = None
        for _ in range(ticks):
            collector.sample(int(time.time() * 1000))
            first = first or (collector.last_tick_ms, collector.last_pcie_ms)
        result = tick_verdict(collector.last_tick_ms, first[1], collector.pcie_every, len(collector.static))
        return [result]
    finally:
        collector.close()
