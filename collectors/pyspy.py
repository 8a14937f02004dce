"""Python stack dumps of a live process with py-spy, and why one is impossible when it is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_PTRACE = 19
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")


@dataclass(frozen=True)
class StackDump:
    pid: int
    ts_ms: int
    threads: list | None  # py-spy's JSON: [{thread_id, thread_name, active, owns_gil, frames: [...]}]
    error: str | None  # one line saying what is missing when there are no stacks


def find_py_spy() -> str | None:
    """py-spy on PATH, else the one installed beside this interpreter (a venv not on PATH)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else None


def _has_cap_sys_ptrace(status_path: str = "/proc/self/status") -> bool:
    try:
        for line in Path(status_path).read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except OSError:
        pass
    return False


def ptrace_problem(
    pid: int, scope_path: Path = PTRACE_SCOPE, status_path: str = "/proc/self/status"
) -> str | None:
    """Why this process may not attach to `pid`, in words a user can act on; None if it may."""
    has_cap = _has_cap_sys_ptrace(status_path)
    try:
        scope = int(scope_path.read_text().strip())
    except (OSError, ValueError):
        scope = None  # no Yama: classic rules (same uid, or CAP_SYS_PTRACE)
    if scope == 3:
        return (
            "kernel.yama.ptrace_scope=3 forbids all ptrace until reboot; "
            "set it to 1 or 2 at boot (sysctl) to allow stack dumps"
        )
    if scope == 2 and not has_cap:
        return (
            "kernel.yama.ptrace_scope=2 allows only CAP_SYS_PTRACE to attach; run gpuwatch's "
            "daemon with AmbientCapabilities=CAP_SYS_PTRACE (the shipped unit does)"
        )
    try:
        target_uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return f"process {pid} is gone"
    if target_uid != os.geteuid() and not has_cap:
        return f"process {pid} belongs to uid {target_uid}; attaching needs the same uid or CAP_SYS_PTRACE"
    if scope == 1 and not has_cap:
        return (
            "kernel.yama.ptrace_scope=1 lets only a parent attach; set it to 0 "
            "(sysctl kernel.yama.ptrace_scope=0) or grant CAP_SYS_PTRACE"
        )
    return None


def dump(pid: int, ts_ms: int, timeout: float = 10.0) -> StackDump:
    """All threads' Python stacks of `pid`, without pausing it (--nonblocking)."""
    exe = find_py_spy()
    if exe is None:
        return StackDump(pid, ts_ms, None, "py-spy is not installed (pip install py-spy)")
    problem = ptrace_problem(pid)
    if problem is not None:
        return StackDump(pid, ts_ms, None, problem)
    try:
        proc = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return StackDump(pid, ts_ms, None, f"py-spy took longer than {timeout:.0f}s")
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return StackDump(pid, ts_ms, None, f"py-spy failed: {lines[-1] if lines else proc.returncode}")
    try:
        threads = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return StackDump(pid, ts_ms, None, "py-spy printed something that is not JSON")
    return StackDump(pid, ts_ms, threads, None)


def format_stacks(threads: list) -> str:
    """Plain-text stacks, innermost frame last, like a Python traceback."""
    out = []
    for thread in threads:
        flags = " (active)" if thread.get("active") else " (idle)"
        out.append(f"Thread {thread.get('thread_name') or thread.get('os_thread_id')}{flags}")
        for frame in reversed(thread.get("frames") or []):
            out.append(
                f"  {frame.get('short_filename') or frame.get('filename')}:{frame.get('line')} "
                f"in {frame.get('name')}"
            )
    return "\n".join(out)
