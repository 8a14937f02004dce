"""`gpuwatch status`: a one-shot table of GPUs, the host and GPU processes, like gpustat.

Reads the newest samples when a daemon is writing the database (newest host sample under
FRESH_MS old); otherwise samples once with the collectors and says so.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field

import click

from gpuwatch.base import fmt
from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path
from gpuwatch.cli.query_cmd import format_table

FRESH_MS = 10_000
GPU_HEADERS = ["GPU", "name", "util", "memory", "temp", "power", "state"]
PROC_HEADERS = ["pid", "user", "GPU", "GPU mem", "command"]


@dataclass
class View:
    source: str  # where the figures come from, shown on the first line
    warning: str = ""  # the daemon cannot write its database: why, shown above everything
    spooled: str = ""  # events waiting in a spool for the daemon
    gpu_note: str = ""  # why there are no GPU rows, if there are none
    gpus: list[list] = field(default_factory=list)
    host: str = ""
    procs: list[list] = field(default_factory=list)


def _gpu_row(index, name, util, used, total, temp, power_mw, state) -> list:
    name = (name or "-").removeprefix("NVIDIA ")  # room for the rest, e.g. "(simulated)"
    return [
        index,
        name,
        "-" if util is None else f"{util}%",
        f"{fmt.size(used)} / {fmt.size(total)}",
        "-" if temp is None else f"{temp}C",
        "-" if power_mw is None else f"{power_mw / 1000:.0f}W",
        state,
    ]


def _mig_rows(gpu_index: int, devices, procs) -> list[list]:
    """Rows for a GPU's MIG devices, under its own: GPU/GI/CI, profile, utilisation ("n/a" when
    NVML gives none), memory and how many of `procs` ((gpu, gi, ci) per process) run there."""
    rows = []
    for d in devices:
        if d.gpu_index != gpu_index:
            continue
        ids = (d.gpu_instance_id, d.compute_instance_id)
        n = procs.count((gpu_index, *ids))
        rows.append(
            [
                fmt.gpu_label(gpu_index, *ids),
                f"└ MIG {d.profile or '?'}",
                "n/a" if d.gpu_util_pct is None else f"{d.gpu_util_pct}%",
                f"{fmt.size(d.mem_used_bytes)} / {fmt.size(d.mem_total_bytes)}",
                "",
                "",
                f"{n} proc{'' if n == 1 else 's'}",
            ]
        )
    return rows


def _host_line(h) -> str:
    if h is None:
        return "host: no sample"
    shm = (
        f"/dev/shm {fmt.size(h.shm_used_bytes)} / {fmt.size(h.shm_total_bytes)}"
        if h.shm_total_bytes
        else "/dev/shm -"
    )
    cpu = "-" if h.cpu_pct is None else f"{h.cpu_pct:.0f}%"
    return (
        f"host: CPU {cpu}  load {h.load1:.2f}  RAM {fmt.size(h.mem_used_bytes)} / "
        f"{fmt.size(h.mem_total_bytes)}  {shm}"
    )


def view_from_db(conn, now: int, away_after_ms: int | None = None) -> View | None:
    """The daemon's newest samples, or None when the database is not being written.
    `away_after_ms` (--live): data older than this says the daemon is away (a restart, say)."""
    from gpuwatch.store import queries

    host = queries.latest_host_sample(conn, now)
    if host is None or now - host.ts_ms > FRESH_MS:
        return None
    age = now - host.ts_ms
    view = View(source=f"daemon data, {fmt.duration(age)} old", host=_host_line(host))
    if away_after_ms is not None and age > away_after_ms:
        view.source = (
            f"daemon not writing: its data is {fmt.duration(age)} old; live again by itself when it is back"
        )
    samples = queries.latest_gpu_samples(conn, now)
    procs = queries.gpu_processes(conn, now)
    migs = queries.mig_devices(conn, now)
    on = [(p.gpu_index, p.gpu_instance_id, p.compute_instance_id) for p in procs]
    for gpu in queries.gpus(conn):
        s = samples.get(gpu.gpu_index)
        if s is None or now - s.ts_ms > FRESH_MS:
            view.gpus.append(
                _gpu_row(
                    gpu.gpu_index, gpu.name, None, None, gpu.mem_total_bytes, None, None, "no recent sample"
                )
            )
            continue
        view.gpus.append(
            _gpu_row(
                gpu.gpu_index,
                gpu.name,
                s.gpu_util_pct,
                s.mem_used_bytes,
                gpu.mem_total_bytes,
                s.temp_c,
                s.power_mw,
                fmt.gpu_state(s.state, gpu.state_since_ms),
            )
        )
        view.gpus += _mig_rows(gpu.gpu_index, migs, on)
    if not view.gpus:
        view.gpu_note = "no NVIDIA GPUs: the daemon samples the host only"
    for p in procs:
        view.procs.append(
            [
                p.pid,
                p.user or p.uid or "-",
                fmt.gpu_label(p.gpu_index, p.gpu_instance_id, p.compute_instance_id),
                fmt.size(p.used_mem_bytes),
                p.cmdline or "-",
            ]
        )
    return view


class Direct:
    """Samples with the collectors in this process (no daemon is writing the database)."""

    def __init__(self, nvml_module=None):
        from collectors.host import HostCollector
        from collectors.nvml import NvmlCollector, NvmlUnavailable
        from collectors.processes import ProcessCollector

        self.host = HostCollector()
        self.procs = ProcessCollector()
        self.host.sample(0)  # primes the CPU % baseline
        self.nvml_error = ""
        try:
            self.nvml = NvmlCollector(nvml=nvml_module)
        except NvmlUnavailable as e:
            self.nvml, self.nvml_error = None, str(e)

    def view(self) -> View:
        from gpuwatch.store import now_ms

        view = View(source="no daemon: sampled now")
        ts = now_ms()
        view.host = _host_line(self.host.sample(ts))
        if self.nvml is None:
            view.gpu_note = f"no NVIDIA driver: {self.nvml_error}"
            return view
        samples, procs = self.nvml.sample(ts)
        migs = _direct_migs(self.nvml.mig_static, self.nvml.sample_mig(ts))
        on = [(p.gpu_index, p.gpu_instance_id, p.compute_instance_id) for p in procs]
        by_index = {s.gpu_index: s for s in samples}
        for g in self.nvml.static:
            s = by_index.get(g.gpu_index)
            view.gpus.append(
                _gpu_row(
                    g.gpu_index,
                    g.name,
                    s and s.gpu_util_pct,
                    s and s.mem_used_bytes,
                    g.mem_total_bytes,
                    s and s.temp_c,
                    s and s.power_mw,
                    # no sample: read too late this once (our process was busy), not lost
                    fmt.gpu_state(s.state if s else "no sample", self.nvml.not_responding_since(g.gpu_index)),
                )
            )
            if s is not None and s.state is None:
                view.gpus += _mig_rows(g.gpu_index, migs, on)
        for p in procs:
            info = self.procs.info(p.pid)
            view.procs.append(
                [
                    p.pid,
                    info.user if info else "-",
                    fmt.gpu_label(p.gpu_index, p.gpu_instance_id, p.compute_instance_id),
                    fmt.size(p.used_mem_bytes),
                    info.cmdline if info else "-",
                ]
            )
        return view

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


def _direct_migs(static, samples) -> list:
    """The collector's MIG facts and samples joined into the store's MigDevice rows."""
    from gpuwatch.store.queries import MigDevice

    facts = {(d.gpu_index, d.gpu_instance_id, d.compute_instance_id): d for d in static}
    return [
        MigDevice(**{**asdict(m), **asdict(facts[key])})
        for m in samples
        if (key := (m.gpu_index, m.gpu_instance_id, m.compute_instance_id)) in facts
    ]


def render(view: View, width: int) -> str:
    parts = [f"WARNING: {view.warning}"] if view.warning else []
    parts.append(view.source)
    if view.spooled:
        parts.append(view.spooled)
    if view.gpu_note:
        parts.append(view.gpu_note)
    if view.gpus:
        parts.append(format_table(GPU_HEADERS, view.gpus, width, right={0, 2, 4, 5}))
    parts.append(view.host)
    if view.procs:
        parts.append(
            format_table(
                PROC_HEADERS,
                sorted(view.procs, key=lambda r: (_gpu_order(r[2]), r[0])),
                width,
                right={0, 2, 3},
            )
        )
    elif view.gpus:
        parts.append("no GPU processes")
    return "\n".join(parts)


def _gpu_order(label: str) -> tuple[int, ...]:
    """ "1/2/0" -> (1, 2, 0): processes sorted by GPU, then MIG device."""
    return tuple(int(part) for part in label.split("/"))


def _read_view(db_path: str, now: int, away_after_ms: int | None = None) -> View | None:
    from pathlib import Path

    from gpuwatch.store import open_ro

    if not Path(db_path).exists():
        return None
    conn = open_ro(db_path)
    try:
        return view_from_db(conn, now, away_after_ms)
    finally:
        conn.close()


@click.command("status")
@db_option
@click.option("--live", is_flag=True, help="Refresh every sampling interval until Ctrl-C.")
@friendly_errors
def status(db, live):
    """Show every GPU (utilisation, memory, temperature, power), the host and GPU processes.

    Uses the daemon's newest samples when it is running, else samples once directly.
    """
    from gpuwatch.base import spool
    from gpuwatch.store import health, now_ms

    db_path = reader_db_path(db)
    cfg = load_config()
    interval = cfg.interval
    direct: Direct | None = None
    try:
        while True:
            # --live: a daemon away for three intervals is said to be (a restart takes seconds).
            away_after = int(3000 * max(cfg.interval, cfg.host_interval)) if live else None
            view = _read_view(db_path, now_ms(), away_after)
            if view is None:
                if direct is None:
                    direct = Direct()
                    time.sleep(0.2)  # lets the first CPU % cover a real interval
                view = direct.view()
            trouble = health.read(db_path, [cfg.socket_path])
            view.warning = trouble.line() if trouble else ""
            view.spooled = spool.waiting_line(spool.reader_dirs(cfg.spool_path)) or ""
            width = shutil.get_terminal_size((80, 24)).columns
            if live:
                click.clear()
            click.echo(render(view, width))
            if not live:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if direct is not None:
            direct.close()
