"""What a run records about itself at start: command, place, code version, GPUs, distributed ranks.

Everything here is best effort and quick: a field that cannot be learned cheaply is None.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from typing import Any, Mapping

GIT_TIMEOUT_S = 1.0
# Set by `gpuwatch run` in its command's environment: "COMMIT CWD" (COMMIT "-" outside a
# repository), the HEAD it found for CWD, so that a Python child there (each rank of a torchrun)
# records it without running git again at its first step.
ENV_GIT_HEAD = "GPUWATCH_GIT_HEAD"


def command_line() -> str:
    """The interpreter command as typed (`python train.py --lr 3e-4`)."""
    return shlex.join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])


class GitHead:
    """`git rev-parse HEAD` in `cwd`, started at once and read by commit(): the caller works
    meanwhile."""

    def __init__(self, cwd: str):
        self.cwd = cwd
        self._commit: str | None = None
        try:
            self._git: subprocess.Popen[str] | None = subprocess.Popen(
                ["git", "rev-parse", "HEAD"],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            self._git = None

    def commit(self) -> str | None:
        """HEAD of the repository holding cwd, or None outside a repository (or without git)."""
        if self._git is not None:
            git, self._git = self._git, None
            try:
                out, _ = git.communicate(timeout=GIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                git.kill()
                git.wait()
                return None
            self._commit = out.strip() if git.returncode == 0 and out.strip() else None
        return self._commit

    def env_value(self) -> str:
        """ENV_GIT_HEAD's value."""
        return f"{self.commit() or '-'} {self.cwd}"


def git_commit(cwd: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """HEAD of the repository holding cwd, or None outside a repository (or without git): as
    env's ENV_GIT_HEAD says when `gpuwatch run` found it for the same directory."""
    commit, _, where = (env or {}).get(ENV_GIT_HEAD, "").partition(" ")
    if commit and where == cwd:
        return None if commit == "-" else commit
    return GitHead(cwd or os.getcwd()).commit()


def torch_versions() -> tuple[str | None, str | None]:
    """(torch version, CUDA version torch was built with), only if the workload imported torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    version = getattr(torch, "__version__", None)
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    # torch.__version__ is a str subclass (TorchVersion); the wire wants plain strings.
    return (None if version is None else str(version)), (None if cuda is None else str(cuda))


def _int_env(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return None


def ranks(env: Mapping[str, str]) -> tuple[int | None, int | None, int | None]:
    """(rank, local_rank, world_size) from torchrun, else from Slurm's task variables."""
    rank = _int_env(env, "RANK", "SLURM_PROCID")
    local_rank = _int_env(env, "LOCAL_RANK", "SLURM_LOCALID")
    world_size = _int_env(env, "WORLD_SIZE", "SLURM_NTASKS")
    if rank is None and local_rank is not None and world_size is not None and not _int_env(env, "NODE_RANK"):
        rank = local_rank  # Lightning's launcher sets no RANK: on the first node, the local one
    return rank, local_rank, world_size


def process_ranks() -> tuple[int | None, int | None, int | None]:
    """This process's ranks(): from its environment, else from torch.distributed once the
    program initialised it (`torch.multiprocessing.spawn` sets no variable: each process passes
    its rank to init_process_group)."""
    rank, local_rank, world_size = ranks(os.environ)
    dist = sys.modules.get("torch.distributed")  # never imported here: only a program's own
    if (world_size is None or rank is None) and dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                rank, world_size = dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 — a backend that cannot say: a lone process, as before
            pass
    return rank, local_rank, world_size


def worker_name() -> str | None:
    """This process's name when Python's multiprocessing started it (`Process-1`, or the one the
    program gave it), else None. Also while a spawned one still imports the program's main
    module, before parent_process() knows: its own command line says it (sys.argv is the
    program's by then)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return None
    if multiprocessing.parent_process() is None and "--multiprocessing-fork" not in sys.orig_argv:
        return None
    name: str = multiprocessing.current_process().name
    return name


def process_start_s() -> float | None:
    """When this process started (seconds since the epoch), or None where it cannot be read."""
    try:
        import psutil

        started: float = psutil.Process().create_time()
        return started
    except ImportError:  # the program's own interpreter, without psutil: as psutil reads it
        return _proc_start_s()
    except Exception:  # /proc hidden: the run is timed from its start instead
        return None


def _proc_start_s() -> float | None:
    """Linux's /proc: the boot time plus the process's start in clock ticks since boot."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _parent_start_s() -> int | None:
    """Start time of our parent (torchrun's agent): the same for every local rank it spawned."""
    try:
        import psutil

        return int(psutil.Process(os.getppid()).create_time())
    except Exception:  # the parent may be gone, or hidden in a container pid namespace
        return None


def _multi_node(env: Mapping[str, str]) -> bool:
    """True when torchrun spread the job over more than one host (its agents are GROUP_WORLD_SIZE)."""
    groups = _int_env(env, "GROUP_WORLD_SIZE")
    world, local = _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_WORLD_SIZE")
    return (groups or 0) > 1 or (world is not None and local is not None and world > local)


def job_id(env: Mapping[str, str], wrapper_run_id: str | None = None) -> str | None:
    """An id every rank of one distributed job shares, on every host, or None for a lone process.

    Slurm's job (and step) id first; then torchrun's run id with its rendezvous endpoint
    (MASTER_ADDR:MASTER_PORT, the same on every host; two clusters may both use `--rdzv-id 1`);
    for a multi-node torchrun with static rendezvous (run id "none") the endpoint alone, as
    nothing else is shared across hosts. On one host: the `gpuwatch run` wrapper's run id, else
    the endpoint plus the launcher's start time (ports are reused by later jobs).
    """
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    endpoint = (
        f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        if env.get("MASTER_ADDR") and env.get("MASTER_PORT")
        else None
    )
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"torchrun-{elastic}" + (f"@{endpoint}" if endpoint else "")
    if endpoint and _multi_node(env):
        return f"torchrun-{endpoint}"
    if wrapper_run_id:
        return wrapper_run_id
    if endpoint:
        return f"{endpoint}@{_parent_start_s()}"
    return None


def gpu_uuids(env: Mapping[str, str]) -> str | None:
    """The GPUs CUDA_VISIBLE_DEVICES allows, as NVML UUIDs when NVML answers, else as given."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries or not all(e.isdigit() for e in entries):
        return ",".join(entries) or None  # already UUIDs (or MIG ids), or nothing visible
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(int(e))) for e in entries]
        finally:
            pynvml.nvmlShutdown()
        return ",".join(u.decode() if isinstance(u, bytes) else u for u in uuids)
    except Exception:  # no driver, or an index NVML does not know: keep the indices
        return ",".join(entries)


def collect(env: Mapping[str, str] | None = None, wrapper_run_id: str | None = None) -> dict[str, Any]:
    """The run_start fields that describe the process (not the user's name/config)."""
    rank, local_rank, world_size = process_ranks() if env is None else ranks(env)
    env = os.environ if env is None else env
    torch_version, cuda_version = torch_versions()
    cwd = os.getcwd()
    return {
        "command": command_line(),
        "cwd": cwd,
        "git_commit": git_commit(cwd, env),
        "host": socket.gethostname(),
        "torch_version": torch_version,
        "cuda_version": cuda_version,
        "gpu_uuids": gpu_uuids(env),
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "job_id": job_id(env, wrapper_run_id),
    }
