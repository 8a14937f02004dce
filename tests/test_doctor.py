"""gpuwatch doctor: the real host (no GPU here) and a faked host with each failure."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml

from gpuwatch.selftest.doctor import Env, healthy, run_checks
from gpuwatch.store import open_rw

GIB = 1024**3
GOOD_TORCH = {
    "version": "2.5.1",
    "cuda": "12.4",
    "cuda_available": True,
    "cudnn": 90100,
    "nccl": "2.21.5",
    "devices": 8,
}


@pytest.fixture
def good_env(tmp_path):
    """A healthy host: 8 (simulated) GPUs, CUDA torch, big /dev/shm, ptrace allowed, a daemon
    listening on a real Unix socket, a real database, an active service."""
    sock_path = Path(f"/tmp/gw-doc-{tmp_path.name[-20:]}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen()
    db = tmp_path / "g.db"
    open_rw(db).close()
    files = {
        "/proc/sys/kernel/yama/ptrace_scope": "1\n",
        "/proc/self/status": "Name:\tgpuwatch\nCapEff:\t0000000000080000\n",
    }  # bit 19
    env = Env(
        nvml=lambda: FakeNvml(gpus=8),
        torch=lambda: dict(GOOD_TORCH),
        read=files.get,
        fs_size=lambda path: 64 * GIB,
        which=lambda name: f"/usr/bin/{name}",
        systemctl=lambda *args: (0, "active" if args[0] == "is-active" else "enabled"),
        socket_path=sock_path,
        db_path=db,
        euid=1000,
    )
    yield env, files
    listener.close()
    sock_path.unlink()


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_host_is_all_ok(good_env):
    env, _ = good_env
    checks = run_checks(env)
    assert [c for c in checks if c.status != "ok"] == []
    got = by_name(checks)
    assert got["GPUs visible"].detail.startswith(
        "8 × NVIDIA H100 80GB HBM3 (simulated); `gpuwatch selftest` checks"
    )
    assert got["NVIDIA driver / NVML"].detail == "driver 550.54.15, supports CUDA 12.4"
    assert got["cuDNN / NCCL"].detail == "cuDNN 90100, NCCL 2.21.5"
    assert healthy(checks)


def test_no_driver_fails_with_the_fix(good_env):
    env, _ = good_env
    env = dataclasses.replace(
        env,
        nvml=lambda: FakeNvml(init_error="DriverNotLoaded"),
        torch=lambda: dict(GOOD_TORCH, cuda_available=False, devices=0),
    )
    got = by_name(run_checks(env))
    assert got["NVIDIA driver / NVML"].status == "fail"
    assert "Driver Not Loaded" in got["NVIDIA driver / NVML"].detail
    assert "nvidia-smi" in got["NVIDIA driver / NVML"].fix
    assert got["GPUs visible"].status == "fail"
    assert got["torch.cuda"].status == "fail" and "no usable NVIDIA driver" in got["torch.cuda"].detail
    assert not healthy(list(got.values()))


@pytest.mark.parametrize(
    "torch_cuda, status, words",
    [
        ("13.0", "fail", "torch needs CUDA 13.0 but the driver supports only 12.4"),
        ("12.8", "warn", "minor-version compatibility"),
        ("12.1", "ok", "torch CUDA 12.1 ≤ driver CUDA 12.4"),
    ],
)
def test_torch_cuda_against_an_old_driver(good_env, torch_cuda, status, words):
    env, _ = good_env
    env = dataclasses.replace(env, torch=lambda: dict(GOOD_TORCH, cuda=torch_cuda))
    check = by_name(run_checks(env))["torch CUDA vs driver"]
    assert (check.status, words in check.detail) == (status, True)
    if status == "fail":
        assert "whl/cu124" in check.fix


def test_cpu_only_torch_and_missing_torch(good_env):
    env, _ = good_env
    got = by_name(run_checks(dataclasses.replace(env, torch=lambda: dict(GOOD_TORCH, cuda=None))))
    assert got["torch.cuda"].status == "fail" and "CPU-only" in got["torch.cuda"].detail
    got = by_name(
        run_checks(
            dataclasses.replace(env, torch=lambda: {"error": "ModuleNotFoundError: No module named 'torch'"})
        )
    )
    assert got["torch"].status == "warn" and "pip install torch" in got["torch"].fix


def test_small_shm_warns(good_env):
    env, _ = good_env
    check = by_name(run_checks(dataclasses.replace(env, fs_size=lambda path: 64 * 1024**2)))["/dev/shm"]
    assert check.status == "warn" and "64.0 MiB" in check.detail and "--shm-size" in check.fix


@pytest.mark.parametrize(
    "scope, capeff, status",
    [
        ("3", "0000000000080000", "fail"),  # nobody may attach, CAP_SYS_PTRACE or not
        ("1", "0000000000000000", "warn"),  # own children only, and we lack the capability
        ("1", "0000000000080000", "ok"),
        ("0", "0000000000000000", "ok"),
    ],
)
def test_ptrace_scope(good_env, scope, capeff, status):
    env, files = good_env
    files["/proc/sys/kernel/yama/ptrace_scope"] = scope + "\n"
    files["/proc/self/status"] = f"CapEff:\t{capeff}\n"
    check = by_name(run_checks(env))["ptrace for stack dumps"]
    assert check.status == status
    if status != "ok":
        assert check.fix


def test_missing_py_spy_warns(good_env):
    env, _ = good_env
    check = by_name(run_checks(dataclasses.replace(env, which=lambda name: None)))["py-spy"]
    assert check.status == "warn" and "pip install py-spy" in check.fix


def test_no_daemon_warns_and_stale_socket_fails(good_env, tmp_path):
    env, _ = good_env
    got = by_name(run_checks(dataclasses.replace(env, socket_path=tmp_path / "none.sock")))
    assert got["daemon socket"].status == "warn" and "embedded" in got["daemon socket"].detail
    stale = Path(f"/tmp/gw-stale-{tmp_path.name[-20:]}.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens: a daemon that died
    try:
        check = by_name(run_checks(dataclasses.replace(env, socket_path=stale)))["daemon socket"]
    finally:
        stale.unlink()
    assert check.status == "fail" and "refuses connections" in check.detail


def test_unreadable_database_fails(good_env, tmp_path):
    env, _ = good_env
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    check = by_name(run_checks(dataclasses.replace(env, db_path=bad)))["database"]
    assert check.status == "fail"


@pytest.mark.parametrize(
    "active, enabled, status",
    [
        ("failed", "enabled", "fail"),
        ("inactive", "disabled", "warn"),
        ("inactive", "", "warn"),
    ],
)
def test_service_state(good_env, active, enabled, status):
    env, _ = good_env
    answers = {"is-active": (3, active), "is-enabled": (1, enabled)}
    check = by_name(run_checks(dataclasses.replace(env, systemctl=lambda *a: answers[a[0]])))[
        "systemd service"
    ]
    assert check.status == status and check.fix


@pytest.mark.slow
def test_doctor_on_this_host_reports_the_missing_driver(tmp_path):
    """This machine has no NVIDIA driver: doctor must say so and exit non-zero."""
    exe = Path(sys.executable).with_name("gpuwatch")
    proc = subprocess.run(
        [str(exe), "doctor", "--json", "--db", str(tmp_path / "none.db")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    driver = next(c for c in report["checks"] if c["name"] == "NVIDIA driver / NVML")
    assert driver["status"] == "fail" and "NVML cannot be loaded" in driver["detail"]
    assert "nvidia-smi" in driver["fix"]
    table = subprocess.run(
        [str(exe), "doctor", "--db", str(tmp_path / "none.db")], capture_output=True, text=True, timeout=180
    )
    assert table.returncode == 1
    assert table.stdout.splitlines()[0].startswith("FAIL  NVIDIA driver / NVML")
