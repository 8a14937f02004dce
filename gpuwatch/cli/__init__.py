"""The `gpuwatch` command: thin click commands over the library, loaded lazily.

Each command lives in its own module of this package; COMMANDS maps its name to
"module:attribute" so `gpuwatch --help` imports none of them (and never textual or torch).
"""

from __future__ import annotations

import importlib

import click

from gpuwatch.base.version import __version__

COMMANDS: dict[str, str] = {
    # name: "gpuwatch.cli.<module>:<click command>"
    "run": "gpuwatch.cli.run_cmd:run_cmd",
    "runs": "gpuwatch.cli.runs_cmd:runs_cmd",
    "show": "gpuwatch.cli.runs_cmd:show_cmd",
    "daemon": "gpuwatch.cli.daemon_cmd:daemon",
    "status": "gpuwatch.cli.status_cmd:status",
    "query": "gpuwatch.cli.query_cmd:query",
    "install-service": "gpuwatch.cli.service_cmd:install_service",
    "compare": "gpuwatch.cli.analysis_cmd:compare_cmd",
    "export": "gpuwatch.cli.analysis_cmd:export_cmd",
    "report": "gpuwatch.cli.analysis_cmd:report_cmd",
    "doctor": "gpuwatch.cli.doctor_cmd:doctor_cmd",
    "tui": "gpuwatch.cli.tui_cmd:tui",
    "profile": "gpuwatch.cli.profile_cmd:profile_cmd",
    "stacks": "gpuwatch.cli.stacks_cmd:stacks_cmd",
    "capacity": "gpuwatch.cli.capacity_cmd:capacity_cmd",
    "oom": "gpuwatch.cli.oom_cmd:oom_cmd",
    "note": "gpuwatch.cli.note_cmd:note_cmd",
    "browse": "gpuwatch.cli.browse_cmd:browse_cmd",
    "demo": "gpuwatch.cli.demo_cmd:demo_cmd",
    "pick": "gpuwatch.cli.pick_cmd:pick_cmd",
    "selftest": "gpuwatch.cli.selftest_cmd:selftest_cmd",
    "trace": "gpuwatch.cli.trace_cmd:trace_cmd",
    "notify": "gpuwatch.cli.notify_cmd:notify",
    "alerts": "gpuwatch.cli.alerts_cmd:alerts_cmd",
    "why": "gpuwatch.cli.why_cmd:why_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx, name):
        if name in COMMANDS:
            module, attr = COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwatch")
def main() -> None:
    """Watch the GPUs of a shared server and the PyTorch runs on them."""
