"""The breakdown as text: one bar a glance reads, the idle's causes, advice, kernels, operators.

Plain strings at a given width (80 by default), shared by `gpuwatch trace`, `gpuwatch profile`
and the TUI's Profile screen.
"""

from __future__ import annotations

from gpuwatch.base import fmt

# (key in the temporal dict, bar character, label)
GPU_PARTS = (("compute_pct", "█", "compute"), ("non_compute_pct", "▒", "comm/mem"), ("idle_pct", "·", "idle"))
CPU_PARTS = (
    ("operators_pct", "█", "operators"),
    ("dataloader_pct", "▒", "data loader"),
    ("optimizer_pct", "▓", "optimizer"),
    ("other_pct", "·", "other"),
)


def bar(shares: dict, parts, width: int) -> str:
    """A stacked bar of `width` cells; each part gets its share, rounded so the cells add up."""
    cells, used, acc = [], 0, 0.0
    for key, ch, _ in parts:
        acc += shares.get(key) or 0.0
        upto = round(width * min(acc, 100.0) / 100.0)
        cells.append(ch * (upto - used))
        used = upto
    return "".join(cells) + " " * (width - used)


def legend(shares: dict, parts) -> str:
    return "  ".join(f"{ch} {label} {shares.get(key) or 0:.0f}%" for key, ch, label in parts)


def _us(us: float | None) -> str:
    """Microseconds as a short time: below a millisecond in µs, above it as fmt.duration does."""
    if us is not None and abs(us) < 1000:
        return f"{us:.0f}µs"
    return fmt.duration(None if us is None else us / 1000.0)


def _cut(name: str, w: int) -> str:
    return name if len(name) <= w else name[: w - 1] + "…"


def headline(rank: dict) -> str:
    """One line: the breakdown's figures (`show`, `compare`, `report` and the run screen use it)."""
    t = rank.get("temporal")
    if t:
        line = (
            f"GPU idle {t['idle_pct']:.0f}% · compute {t['compute_pct']:.0f}% · "
            f"comm/mem {t['non_compute_pct']:.0f}%"
        )
        idle = rank.get("idle") or {}
        causes = [
            (idle.get(f"{k}_pct") or 0, label)
            for k, label in (
                ("dataloader", "data loader"),
                ("host_wait", "launch"),
                ("sync", "synchronise"),
                ("other", "other"),
            )
        ]
        top = max(causes)
        if t["idle_pct"] and top[0]:
            line += f" (idle: {top[0]:.0f}% {top[1]})"
        return line
    c = rank.get("cpu")
    if c:
        return (
            f"CPU: operators {c['operators_pct']:.0f}% · data loader "
            f"{c['dataloader_pct']:.0f}% · optimizer {c['optimizer_pct']:.0f}%"
        )
    return "no GPU or CPU activity in the trace"


def shares_and_parts(rank: dict) -> tuple[dict, tuple]:
    """What the bar shows: GPU time when the trace has GPU activity, else the CPU's step time."""
    if rank.get("temporal"):
        return rank["temporal"], GPU_PARTS
    return rank.get("cpu") or {}, CPU_PARTS


def detail_lines(rank: dict, width: int = 80, top: int = 8, operators: bool = True) -> list[str]:
    """Below the bar: the idle's causes, overlap, kernel groups and top kernels (GPU traces), or
    the top operators (CPU-only traces, unless a table of them follows anyway)."""
    lines: list[str] = []
    t = rank.get("temporal")
    if t:
        i = rank["idle"]
        if i["idle_us"]:
            lines.append(
                "idle: "
                + "  ".join(
                    f"{label} {i[f'{k}_pct']:.0f}%"
                    for k, label in (
                        ("host_wait", "launch-bound"),
                        ("dataloader", "data loader"),
                        ("sync", "synchronise"),
                        ("other", "other"),
                    )
                )
            )
        if rank.get("overlap_pct") is not None:
            lines.append(f"comm/compute overlap {rank['overlap_pct']:.0f}%")
        groups = "  ".join(
            f"{g['group']} {g['share_pct']:.0f}%"
            for g in rank["kernel_groups"]
            if (g["share_pct"] or 0) >= 0.5
        )
        lines += _wrap("kernels: " + groups, width)
        name_w = width - 28
        lines.append(f"{'KERNEL':<{name_w}} {'GROUP':<10} {'CALLS':>5} {'TIME':>6} {'%':>3}")
        for k in rank["kernels"][:top]:
            lines.append(
                f"{_cut(k['name'], name_w):<{name_w}} {_cut(k['group'], 10):<10} "
                f"{k['count']:>5} {_us(k['total_us']):>6} {k['share_pct']:>3.0f}"
            )
    elif operators and rank.get("operators"):
        name_w = width - 16
        lines.append(f"{'OPERATOR':<{name_w}} {'CALLS':>5} {'SELF':>8}")
        for op in rank["operators"][:top]:
            lines.append(f"{_cut(op['name'], name_w):<{name_w}} {op['calls']:>5} {_us(op['self_us']):>8}")
    return lines


def rank_lines(rank: dict, width: int = 80, top: int = 8, operators: bool = True) -> list[str]:
    head = f"rank {rank['rank']}  "
    room = width - len(head)
    path = rank["file"] if len(rank["file"]) <= room else "…" + rank["file"][-(room - 1) :]
    lines = [head + path]
    shares, parts = shares_and_parts(rank)
    if rank.get("temporal"):
        lines.append(f"GPU time {_us(shares['kernel_time_us'])} over {rank['steps_analysed']} steps")
    elif shares:
        lines.append(
            f"CPU time {_us(shares['wall_us'])} over {rank['steps_analysed']} steps "
            f"(no GPU activity in the trace)"
        )
    if shares:
        lines += ["[" + bar(shares, parts, max(8, width - 2)) + "]", legend(shares, parts)]
    return lines + detail_lines(rank, width, top, operators)


def step_lines(rank: dict, most: int = 8) -> list[str]:
    """Per ProfilerStep: the same split, to spot the odd step (first `most`; all in JSON)."""
    steps = rank.get("steps") or []
    if not steps:
        return []
    if rank.get("temporal"):
        out = [f"{'STEP':>6} {'GPU TIME':>9} {'IDLE':>5} {'COMPUTE':>8} {'COMM/MEM':>8}  IDLE WAITS ON"]
        for s in steps[:most]:
            causes = [
                (s[f"idle_{k}_pct"] or 0, label)
                for k, label in (
                    ("dataloader", "data loader"),
                    ("host_wait", "launch"),
                    ("sync", "synchronise"),
                )
            ]
            top = max(causes)
            out.append(
                f"{s['step']:>6} {_us(s['kernel_time_us']):>9} {s['idle_pct'] or 0:>4.0f}% "
                f"{s['compute_pct'] or 0:>7.0f}% {s['non_compute_pct'] or 0:>7.0f}%  "
                + (f"{top[1]} {top[0]:.0f}%" if top[0] else "-")
            )
    else:
        out = [f"{'STEP':>6} {'WALL':>9} {'OPERATORS':>9} {'LOADER':>7} {'OPTIM':>6} {'OTHER':>6}"]
        for s in steps[:most]:
            c = s["cpu"]
            out.append(
                f"{s['step']:>6} {_us(c['wall_us']):>9} {c['operators_pct'] or 0:>8.0f}% "
                f"{c['dataloader_pct'] or 0:>6.0f}% {c['optimizer_pct'] or 0:>5.0f}% "
                f"{c['other_pct'] or 0:>5.0f}%"
            )
    if len(steps) > most:
        out.append(f"{'':>6} … {len(steps) - most} more steps (--format json)")
    return out


def _wrap(text: str, width: int) -> list[str]:
    out, line = [], ""
    for word in text.split("  "):
        if line and len(line) + 2 + len(word) > width:
            out.append(line)
            line = "  " + word
        else:
            line = f"{line}  {word}" if line else word
    return out + ([line] if line else [])


def advice_lines(advice: list[str], width: int = 80) -> list[str]:
    out = []
    for a in advice:
        words, line = a.split(" "), "• "
        for w in words:
            if len(line) + len(w) + 1 > width and line.strip("• "):
                out.append(line.rstrip())
                line = "  "
            line += w + " "
        out.append(line.rstrip())
    return out


def table(result: dict, width: int = 80) -> str:
    lines: list[str] = []
    for r in result["ranks"]:
        lines += rank_lines(r, width) + [""] + step_lines(r) + [""]
    slow = result.get("slowest")
    if slow and slow["slower_pct"] is not None:
        lines.append(f"slowest rank: {slow['rank']}, compute {slow['slower_pct']:+.0f}% vs the median rank")
    lines += ["advice:"] + (advice_lines(result["advice"], width) or ["  none: nothing stands out"])
    return "\n".join(lines)
