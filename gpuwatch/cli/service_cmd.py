"""`gpuwatch install-service`: install the systemd unit and the gpuwatch system user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click

UNIT_NAME = "gpuwatch.service"
NOTIFY_UNIT_NAME = "gpuwatch-notify.service"  # alert delivery, the one part that reaches the network
SYSUSERS_NAME = "gpuwatch.sysusers.conf"
# The unit files ship in the source tree next to the package (editable/dev installs).
SOURCE_DIR = Path(__file__).resolve().parents[2] / "systemd"


def gpuwatch_executable() -> str:
    """Absolute path of the `gpuwatch` being run, for ExecStart=."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "gpuwatch" and argv0.exists():
        return str(argv0.absolute())
    found = shutil.which("gpuwatch")
    if found:
        return str(Path(found).absolute())
    raise click.ClickException(
        "cannot find the gpuwatch executable to put in ExecStart=; "
        "run install-service through the installed `gpuwatch` command"
    )


def render(executable: str) -> dict[str, str]:
    """{file name: text} with ExecStart= pointing at `executable`."""
    try:
        unit = (SOURCE_DIR / UNIT_NAME).read_text()
        notify_unit = (SOURCE_DIR / NOTIFY_UNIT_NAME).read_text()
        sysusers = (SOURCE_DIR / SYSUSERS_NAME).read_text()
    except FileNotFoundError:
        raise click.ClickException(
            f"unit files not found in {SOURCE_DIR}; install gpuwatch from a source checkout"
        ) from None
    if any(c.isspace() for c in executable):
        raise click.ClickException(f"ExecStart path must not contain spaces: {executable!r}")
    unit, notify_unit = (
        re.sub(r"^ExecStart=\S+", f"ExecStart={executable}", text, count=1, flags=re.M)
        for text in (unit, notify_unit)
    )
    return {UNIT_NAME: unit, NOTIFY_UNIT_NAME: notify_unit, SYSUSERS_NAME: sysusers}


def _run(cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        click.echo(f"skipped (no {cmd[0]} here): {' '.join(cmd)}")
        return
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise click.ClickException(f"{' '.join(cmd)} failed: {result.stderr.strip() or result.returncode}")
    click.echo(f"ran: {' '.join(cmd)}")


@click.command("install-service")
@click.option("--print", "print_only", is_flag=True, help="Print the files instead of installing them.")
@click.option(
    "--prefix",
    type=click.Path(file_okay=False),
    help="Install under this root (staging/packaging); runs no systemd tools.",
)
def install_service(print_only, prefix):
    """Install the systemd service (Type=notify, hardened) and the gpuwatch system user.

    Writes /etc/systemd/system/gpuwatch.service, gpuwatch-notify.service (alert delivery) and
    /etc/sysusers.d/gpuwatch.conf, runs
    systemd-sysusers and `systemctl daemon-reload`. Then: systemctl enable --now gpuwatch
    """
    files = render(gpuwatch_executable())
    if print_only:
        for name, text in files.items():
            click.echo(f"# ---- {name}\n{text}")
        return
    root = Path(prefix) if prefix else Path("/")
    targets = {
        UNIT_NAME: root / "etc/systemd/system" / UNIT_NAME,
        NOTIFY_UNIT_NAME: root / "etc/systemd/system" / NOTIFY_UNIT_NAME,
        SYSUSERS_NAME: root / "etc/sysusers.d" / "gpuwatch.conf",
    }
    for name, target in targets.items():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[name])
            os.chmod(target, 0o644)
        except PermissionError:
            raise click.ClickException(f"cannot write {target}: run as root (sudo) or use --prefix") from None
        except OSError as e:
            raise click.ClickException(f"cannot write {target}: {e.strerror}") from None
        click.echo(f"wrote {target}")
    if prefix:
        return
    _run(["systemd-sysusers", str(targets[SYSUSERS_NAME])])
    _run(["systemctl", "daemon-reload"])
    click.echo("now: systemctl enable --now gpuwatch (and gpuwatch-notify to send alerts)")
