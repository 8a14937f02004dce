"""An OOM postmortem as text: the list of postmortems and one run's in full, as `gpuwatch oom`
prints them and the TensorBoard export and alerts quote them."""

from __future__ import annotations

import dataclasses

from gpuwatch.base import fmt

TRACEBACK_TAIL_LINES = 8
MEMORY_VIZ = "https://pytorch.org/memory_viz"


def list_text(listed) -> str:
    from gpuwatch.store.postmortems import headroom_bytes

    if not listed:
        return "no OOM postmortems recorded"
    lines = [
        f"{'RUN':<12} {'NAME':<16} {'USER':<10} {'WHEN':<14} {'KIND':<4} {'REQUESTED':>10} "
        f"{'FREE':>10} {'PHASE':<9} STEP"
    ]
    for pm, name, user in listed:
        free = headroom_bytes(dataclasses.asdict(pm))
        lines.append(
            f"{pm.run_id[:12]:<12} {(name or '-')[:16]:<16} {(user or '-')[:10]:<10} "
            f"{fmt.local_time(pm.ts_ms):<14} {pm.kind:<4} {fmt.size(pm.requested_bytes):>10} "
            f"{fmt.size(free):>10} {pm.phase or '-':<9} {fmt.MISSING if pm.step is None else pm.step}"
        )
    return "\n".join(lines)


def figure_lines(pm) -> list[str]:
    """The figures under a postmortem's headline; the first is the run.oom alert's headline."""
    if pm.kind == "gpu":
        cached = (
            None
            if pm.reserved_bytes is None or pm.allocated_bytes is None
            else pm.reserved_bytes - pm.allocated_bytes
        )
        return [
            f"  requested {fmt.size(pm.requested_bytes)}   free {fmt.size(pm.free_bytes)} "
            f"of {fmt.size(pm.total_bytes)} on GPU {fmt.MISSING if pm.device is None else pm.device}",
            f"  allocated {fmt.size(pm.allocated_bytes)}   reserved {fmt.size(pm.reserved_bytes)} "
            f"({fmt.size(cached)} cached but unallocated)",
        ]
    rlimit = pm.stats.get("rlimit_as_bytes")
    return [
        f"  requested {fmt.size(pm.requested_bytes)}   available {fmt.size(pm.available_bytes)} "
        f"of {fmt.size(pm.total_bytes)} (host)",
        f"  RSS {fmt.size(pm.rss_bytes)}   cgroup limit {fmt.size(pm.cgroup_limit_bytes)}   "
        f"RLIMIT_AS {fmt.size(rlimit)}",
    ]


def show_text(run, postmortems) -> str:
    lines: list[str] = []
    for pm in postmortems:
        where = f" step {pm.step}" if pm.step is not None else ""
        lines += [
            f"OOM postmortem ({pm.kind})  run {run.run_id}"
            + (f"  {run.name}" if run.name else "")
            + f"  {fmt.local_time(pm.ts_ms)}",
            f"  phase {pm.phase or '-'}{where}   seq_len {fmt.MISSING if pm.seq_len is None else pm.seq_len}"
            f"   batch {fmt.MISSING if pm.batch is None else pm.batch}",
            *figure_lines(pm),
        ]
        if pm.kind == "gpu":
            if pm.neighbours is None:
                lines.append("other processes on this GPU: unknown (NVML was not readable)")
            elif not pm.neighbours:
                lines.append("other processes on this GPU: none")
            else:
                lines.append("other processes on this GPU:")
                lines.append(f"  {'PID':>8} {'USER':<12} {'USED':>10}  RUN")
                lines += [
                    f"  {n.get('pid'):>8} {(n.get('user') or '-')[:12]:<12} "
                    f"{fmt.size(n.get('used_mem_bytes')):>10}  {n.get('run_id') or '-'}"
                    for n in pm.neighbours
                ]
        if pm.advice:
            lines.append("advice:")
            for i, item in enumerate(pm.advice, 1):
                lines += [f"  {i}. {item.get('title')}", f"     {item.get('detail')}"]
        if pm.largest_blocks:
            lines.append("largest live blocks (allocation stacks):")
            for block in pm.largest_blocks[:5]:
                stack = block.get("stack") or []
                lines.append(
                    f"  {fmt.size(block.get('size_bytes')):>10}  {stack[0] if stack else '(no stack)'}"
                )
        if pm.snapshot_path:
            lines.append(f"memory snapshot: {pm.snapshot_path} (open in {MEMORY_VIZ})")
        if pm.traceback:
            lines.append("traceback (last lines):")
            lines += ["  " + line for line in pm.traceback.rstrip().splitlines()[-TRACEBACK_TAIL_LINES:]]
        lines.append("")
    return "\n".join(lines).rstrip()
