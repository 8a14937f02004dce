"""install-service renders a unit that systemd accepts, and a sysusers file that creates the user."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from systools import needs_tools

GPUWATCH = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpuwatch"
needs_systemd_analyze = needs_tools("systemd-analyze")


def gw(*args, **kw):
    return subprocess.run([str(GPUWATCH), *args], capture_output=True, text=True, timeout=60, **kw)


def install_to(tmp_path) -> tuple[Path, Path]:
    result = gw("install-service", "--prefix", str(tmp_path / "root"))
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "root/etc/systemd/system/gpuwatch.service"
    sysusers = tmp_path / "root/etc/sysusers.d/gpuwatch.conf"
    return unit, sysusers


def test_unit_runs_the_installed_gpuwatch_as_a_notify_service(tmp_path):
    unit, _ = install_to(tmp_path)
    text = unit.read_text()
    exec_start = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert exec_start == [f"ExecStart={GPUWATCH} daemon --system"]
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30",
        "Restart=on-failure",
        "User=gpuwatch",
        "StateDirectory=gpuwatch",
        "RuntimeDirectory=gpuwatch",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "CapabilityBoundingSet=CAP_SYS_PTRACE",
        "UMask=0022",
    ):
        assert line in text.splitlines(), line
    assert not any(line.startswith("PrivateDevices=") for line in text.splitlines())  # hides /dev/nvidia*
    assert oct(unit.stat().st_mode & 0o777) == "0o644"


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_rendered_unit(tmp_path):
    unit, _ = install_to(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # verify prints warnings for unknown settings without failing; there must be none.
    assert "Unknown" not in result.stderr and "Invalid" not in result.stderr, result.stderr


@needs_tools("systemd-sysusers")
def test_sysusers_file_creates_the_service_user_and_admin_group(tmp_path):
    _, sysusers = install_to(tmp_path)
    root = tmp_path / "sysroot"
    (root / "etc").mkdir(parents=True)
    result = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(sysusers)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    passwd = (root / "etc/passwd").read_text()
    groups = (root / "etc/group").read_text()
    assert any(
        line.startswith("gpuwatch:") and line.endswith("/usr/sbin/nologin") for line in passwd.splitlines()
    )
    assert "gpuwatch-admin:" in groups


def test_print_shows_both_files_and_writes_nothing(tmp_path):
    result = gw("install-service", "--print", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "# ---- gpuwatch.service" in result.stdout
    assert "# ---- gpuwatch.sysusers.conf" in result.stdout
    assert f"ExecStart={GPUWATCH} daemon --system" in result.stdout
    assert os.listdir(tmp_path) == []


def test_unwritable_target_is_one_clear_line(tmp_path):
    (tmp_path / "etc").write_text("a file where a directory should be")
    result = gw("install-service", "--prefix", str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"Error: cannot write {tmp_path}/etc/systemd/system/gpuwatch.service: Not a directory"
    ]
