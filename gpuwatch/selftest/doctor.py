"""`gpuwatch doctor`: checks of everything gpuwatch and a PyTorch run on this host depend on.

Each check is a function of an `Env`, which holds every way the checks touch the system, so a
test can fake a missing driver, an old driver, a small /dev/shm, ptrace_scope=3 or no daemon.
Each result says ok / warn / fail and, when not ok, the concrete fix.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from collectors.deadline import TimeoutError, call_with_deadline
from gpuwatch.base import fmt, paths, spool

OK, WARN, FAIL = "ok", "warn", "fail"
SHM_MIN_BYTES = 8 * 1024**3
CAP_SYS_PTRACE = 19
SERVICE = "gpuwatch.service"
NVML_DEADLINE_S = 10.0  # the driver's first nvmlInit can take seconds without persistence mode

# Run in a child interpreter: torch's import is slow and must not leak into the caller.
_TORCH_PROBE = """
import json
try:
    import torch
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    raise SystemExit
out = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False,
       "cudnn": None, "nccl": None, "devices": 0}
try:
    out["cuda_available"] = torch.cuda.is_available()
    out["devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    out["probe_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def _load_pynvml():
    import pynvml

    return pynvml


def _probe_torch() -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return {"error": "importing torch took over 120 s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _fs_size(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def _connect(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(path))


def _systemctl(*args: str) -> tuple[int, str] | None:
    exe = shutil.which("systemctl")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode, proc.stdout.strip()


def _which(name: str) -> str | None:
    # The venv's bin first: py-spy is installed next to gpuwatch even when that isn't on PATH.
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


@dataclass
class Env:
    """How the checks see the host; every field can be replaced by a fake."""

    nvml: Callable[[], Any] = _load_pynvml  # returns the pynvml module (or a fake)
    torch: Callable[[], dict] = _probe_torch
    read: Callable[[str], str | None] = _read
    fs_size: Callable[[str], int | None] = _fs_size
    which: Callable[[str], str | None] = _which
    connect: Callable[[Path], None] = _connect
    systemctl: Callable[..., tuple[int, str] | None] = _systemctl
    socket_path: Path | None = None
    db_path: Path | None = None
    spool_dir: Path | None = None
    euid: int = field(default_factory=os.geteuid)


@dataclass
class _Facts:
    """What earlier checks learned that later ones need (driver's CUDA, torch's build)."""

    nvml_error: str | None = None
    driver_cuda: tuple[int, int] | None = None
    torch: dict = field(default_factory=dict)


def _cuda_tuple(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def check_nvml(env: Env, facts: _Facts) -> list[Check]:
    fix = (
        "install the NVIDIA driver (e.g. `apt install nvidia-driver-550`, then reboot) and check "
        "that `nvidia-smi` works; in a container, run it with `--gpus all`"
    )
    hung = [
        Check(
            "NVIDIA driver / NVML",
            FAIL,
            f"NVML did not answer within {NVML_DEADLINE_S:g} s: a GPU or the driver hangs",
            "look for Xid errors (`sudo dmesg | grep -i xid`) "
            "and check `nvidia-smi`; a hung GPU usually needs a reset or a reboot",
        )
    ]
    try:
        nvml = env.nvml()
        # A hung GPU blocks NVML calls on it for good: the doctor says so instead of hanging.
        call_with_deadline(nvml.nvmlInit, NVML_DEADLINE_S)
    except TimeoutError:
        return hung
    except Exception as e:  # ImportError, NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        facts.nvml_error = str(e) or type(e).__name__
        return [
            Check("NVIDIA driver / NVML", FAIL, f"NVML cannot be loaded: {facts.nvml_error}", fix),
            Check("GPUs visible", FAIL, "no GPUs can be listed without NVML", "see the driver check"),
        ]
    try:
        driver, cuda, names = call_with_deadline(lambda: _nvml_facts(nvml), NVML_DEADLINE_S)
    except TimeoutError:
        return hung
    except Exception as e:
        return [Check("NVIDIA driver / NVML", FAIL, f"NVML loaded but failed: {e}", fix)]
    facts.driver_cuda = (cuda // 1000, cuda % 1000 // 10)
    count = len(names)
    checks = [
        Check(
            "NVIDIA driver / NVML",
            OK,
            f"driver {driver}, supports CUDA {facts.driver_cuda[0]}.{facts.driver_cuda[1]}",
        )
    ]
    if count == 0:
        checks.append(
            Check(
                "GPUs visible",
                FAIL,
                "the driver sees no GPU",
                "check `nvidia-smi`, CUDA_VISIBLE_DEVICES and the container's --gpus",
            )
        )
    else:
        kinds = sorted(set(names))
        checks.append(
            Check(
                "GPUs visible",
                OK,
                f"{count} × {', '.join(kinds)}; `gpuwatch selftest` checks "
                "gpuwatch's figures for them against nvidia-smi and CUDA",
            )
        )
    return checks


def _nvml_facts(nvml) -> tuple[str, int, list[str]]:
    """Driver version, CUDA version code and every GPU's name; shuts NVML down after."""
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
        names = []
        for i in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        return driver.decode() if isinstance(driver, bytes) else driver, cuda, names
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def check_torch(env: Env, facts: _Facts) -> list[Check]:
    info = facts.torch = env.torch()
    if "error" in info:
        return [
            Check(
                "torch",
                WARN,
                f"not importable: {info['error']}",
                "install it where your workloads run: pip install torch (the daemon and TUI do not need it)",
            )
        ]
    checks = [
        Check(
            "torch",
            OK,
            f"torch {info['version']}"
            + (f" built for CUDA {info['cuda']}" if info.get("cuda") else " (CPU-only build)"),
        )
    ]
    if not info.get("cuda"):
        checks.append(
            Check(
                "torch.cuda",
                FAIL,
                "torch is a CPU-only build: CUDA is not available",
                "install a CUDA build, e.g. pip install torch "
                "--index-url https://download.pytorch.org/whl/cu124",
            )
        )
        return checks
    if info.get("cuda_available"):
        checks.append(Check("torch.cuda", OK, f"available, {info.get('devices', 0)} device(s)"))
    else:
        reason = (
            f"no usable NVIDIA driver ({facts.nvml_error})"
            if facts.nvml_error
            else "torch.cuda.is_available() is False"
        )
        checks.append(
            Check(
                "torch.cuda",
                FAIL,
                reason,
                "fix the driver check above; then "
                "`python -c 'import torch; print(torch.cuda.is_available())'`",
            )
        )
    checks.append(_cuda_versions(_cuda_tuple(info["cuda"]), facts.driver_cuda))
    if info.get("cuda_available"):
        cudnn, nccl = info.get("cudnn"), info.get("nccl")
        checks.append(
            Check(
                "cuDNN / NCCL",
                OK if cudnn and nccl else WARN,
                f"cuDNN {cudnn or 'missing'}, NCCL {nccl or 'missing'}",
                "" if cudnn and nccl else "reinstall the CUDA build of torch, which bundles both",
            )
        )
    return checks


def _cuda_versions(torch_cuda, driver_cuda) -> Check:
    name = "torch CUDA vs driver"
    if torch_cuda is None or driver_cuda is None:
        return Check(
            name, WARN, "cannot compare: the driver's CUDA version is unknown", "fix the driver check above"
        )
    t, d = (f"{v[0]}.{v[1]}" for v in (torch_cuda, driver_cuda))
    if torch_cuda[0] > driver_cuda[0]:
        return Check(
            name,
            FAIL,
            f"torch needs CUDA {t} but the driver supports only {d}",
            f"upgrade the NVIDIA driver to one supporting CUDA {t}, or install torch built "
            f"for CUDA {d[0:2]}x (pip install torch --index-url "
            f"https://download.pytorch.org/whl/cu{driver_cuda[0]}{driver_cuda[1]})",
        )
    if torch_cuda > driver_cuda:
        return Check(
            name,
            WARN,
            f"torch built for CUDA {t}, driver supports {d} (minor-version "
            "compatibility: most kernels work, some PTX-compiled ones may not)",
            f"upgrade the driver to one supporting CUDA {t} if you see "
            "'CUDA driver version is insufficient' or PTX errors",
        )
    return Check(name, OK, f"torch CUDA {t} ≤ driver CUDA {d}")


def check_shm(env: Env, facts: _Facts) -> list[Check]:
    size = env.fs_size("/dev/shm")
    if size is None:
        return [
            Check(
                "/dev/shm",
                WARN,
                "/dev/shm is missing",
                "mount a tmpfs at /dev/shm; DataLoader workers and NCCL need it",
            )
        ]
    if size < SHM_MIN_BYTES:
        return [
            Check(
                "/dev/shm",
                WARN,
                f"{fmt.size(size)}, below {fmt.size(SHM_MIN_BYTES)}: DataLoader "
                "workers and NCCL can fail with 'bus error' or 'No space left on device'",
                "docker run --shm-size=16g …, or `sudo mount -o remount,size=16G /dev/shm`",
            )
        ]
    return [Check("/dev/shm", OK, fmt.size(size))]


def _has_cap_ptrace(status: str | None) -> bool:
    for line in (status or "").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def check_ptrace(env: Env, facts: _Facts) -> list[Check]:
    checks = []
    spy = env.which("py-spy")
    if spy is None:
        checks.append(
            Check(
                "py-spy",
                WARN,
                "not found: stall stack dumps are off",
                "pip install py-spy (in the environment gpuwatch runs from)",
            )
        )
    else:
        checks.append(Check("py-spy", OK, spy))
    scope_text = env.read("/proc/sys/kernel/yama/ptrace_scope")
    # No Yama file: classic ptrace rules, the same as scope 0.
    scope = int(scope_text.strip()) if scope_text and scope_text.strip().isdigit() else 0
    cap = env.euid == 0 or _has_cap_ptrace(env.read("/proc/self/status"))
    name = "ptrace for stack dumps"
    if scope >= 3:
        checks.append(
            Check(
                name,
                FAIL,
                "kernel.yama.ptrace_scope=3: no process may attach, not even root",
                "set kernel.yama.ptrace_scope=1 in /etc/sysctl.d/ and reboot (3 cannot be "
                "lowered at run time)",
            )
        )
    elif cap:
        checks.append(Check(name, OK, f"ptrace_scope={scope}, CAP_SYS_PTRACE held: can dump any run"))
    elif scope == 0:
        checks.append(Check(name, OK, "ptrace_scope=0: can dump your own runs"))
    else:
        checks.append(
            Check(
                name,
                WARN,
                f"ptrace_scope={scope} and no CAP_SYS_PTRACE: this user can only "
                "dump runs started under `gpuwatch run`"
                if scope == 1
                else f"ptrace_scope={scope}: only CAP_SYS_PTRACE may attach",
                "run the daemon as the systemd service (it holds CAP_SYS_PTRACE), or "
                "`sudo sysctl kernel.yama.ptrace_scope=0`",
            )
        )
    return checks


def check_daemon(env: Env, facts: _Facts) -> list[Check]:
    from gpuwatch.store import StoreError, health, open_ro

    sock = env.socket_path or (
        paths.default_socket_path(True) if paths.system_daemon_present() else paths.default_socket_path(False)
    )
    checks = []
    if not sock.exists():
        checks.append(
            Check(
                "daemon socket",
                WARN,
                f"no daemon at {sock}: runs record into your own database (embedded mode)",
                "sudo gpuwatch install-service (shared server) or `gpuwatch daemon &`",
            )
        )
    else:
        try:
            env.connect(sock)
            checks.append(Check("daemon socket", OK, f"{sock} accepts connections"))
        except OSError as e:
            checks.append(
                Check(
                    "daemon socket",
                    FAIL,
                    f"{sock} exists but refuses connections "
                    f"({e.strerror or e}): the daemon died or the socket is stale",
                    f"restart the daemon (sudo systemctl restart {SERVICE}) or remove {sock}",
                )
            )
    waiting = spool.waiting_line(spool.reader_dirs(env.spool_dir))
    if waiting:
        checks.append(
            Check(
                "spooled events",
                WARN,
                waiting,
                "start the daemon (sudo systemctl start gpuwatch, or `gpuwatch daemon &`): "
                "it stores them within a minute, even for runs that have ended",
            )
        )
    db = env.db_path or (
        paths.default_db_path(True) if paths.system_daemon_present() else paths.default_db_path(False)
    )
    trouble = health.read(db, [sock])
    if trouble is not None:
        checks.append(
            Check(
                "database writes",
                FAIL,
                trouble.line(),
                "free space on its filesystem (or make it writable); the daemon resumes "
                "by itself, retention already ran early",
            )
        )
    try:
        conn = open_ro(db)
        conn.execute("SELECT count(*) FROM runs").fetchone()
        hung = _hung_gpus(conn)
        conn.close()
        checks.append(Check("database", OK, f"{db} readable"))
        if hung:
            checks.append(
                Check(
                    "GPUs answering",
                    FAIL,
                    "; ".join(f"GPU {i} {fmt.gpu_state('hung', since)}" for i, since in hung)
                    + ": its NVML calls block (the others are sampled on)",
                    "look for Xid errors (`sudo dmesg | grep -i xid`); a hung GPU usually needs "
                    "`nvidia-smi -r -i N` with nothing running on it, or a reboot",
                )
            )
    except StoreError as e:
        missing = not Path(db).exists()
        checks.append(
            Check(
                "database",
                WARN if missing else FAIL,
                str(e),
                "it is created by the daemon or the first tracked run"
                if missing
                else "check the file's permissions, or move it aside and let gpuwatch make a new one",
            )
        )
    return checks


def _hung_gpus(conn) -> list[tuple[int, int | None]]:
    """(GPU, since ms) of the GPUs the sampler finds not responding."""
    try:
        return conn.execute(
            "SELECT gpu_index, state_since_ms FROM gpus WHERE state = 'hung' ORDER BY gpu_index"
        ).fetchall()
    except sqlite3.OperationalError:  # a database from before GPU states had a time
        return []


def check_service(env: Env, facts: _Facts) -> list[Check]:
    active = env.systemctl("is-active", SERVICE)
    if active is None:
        return []  # not a systemd host
    state = active[1]
    name = "systemd service"
    if not state:  # systemctl answers nothing when systemd is not PID 1 (containers)
        return [
            Check(
                name,
                WARN,
                "systemctl is installed but systemd is not running here",
                "run `gpuwatch daemon` under this container's own init instead",
            )
        ]
    if state == "active":
        return [Check(name, OK, f"{SERVICE} active")]
    enabled = env.systemctl("is-enabled", SERVICE)
    if enabled is None or enabled[1] in ("", "not-found"):
        return [
            Check(
                name,
                WARN,
                f"{SERVICE} is not installed",
                "sudo gpuwatch install-service (for a shared server)",
            )
        ]
    if state == "failed":
        return [
            Check(
                name,
                FAIL,
                f"{SERVICE} failed",
                f"journalctl -u {SERVICE} -n 50; then sudo systemctl restart {SERVICE}",
            )
        ]
    return [
        Check(name, WARN, f"{SERVICE} is {state} ({enabled[1]})", f"sudo systemctl enable --now {SERVICE}")
    ]


CHECKS = (check_nvml, check_torch, check_shm, check_ptrace, check_daemon, check_service)


def run_checks(env: Env | None = None) -> list[Check]:
    env = env or Env()
    facts = _Facts()
    out: list[Check] = []
    for check in CHECKS:
        out.extend(check(env, facts))
    return out


def healthy(checks: list[Check]) -> bool:
    return all(c.status != FAIL for c in checks)


def as_json(checks: list[Check]) -> str:
    return json.dumps({"ok": healthy(checks), "checks": [asdict(c) for c in checks]}, indent=1)
