"""What `gpuwatch run` and the Python child it starts agree on: the run's id and name in the
child's environment (an instrumented child adds its steps to that run), and the file where the
child leaves its end state for the wrapper. Light on purpose: the wrapper reads it before the
child starts, without the rest of the client."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwatch.base import paths

# Set by `gpuwatch run` for its child: an instrumented child adds its steps to that run.
ENV_RUN_ID = "GPUWATCH_RUN_ID"
# ... and the wrapper's run name: a rank run of that job is named NAME/rankN.
ENV_RUN_NAME = "GPUWATCH_RUN_NAME"


def new_run_id() -> str:
    return os.urandom(6).hex()  # (secrets.token_hex's own bytes, without importing hmac)


def end_state_path(run_id: str) -> Path:
    """Where an attached child leaves its end state (status, error) for the `gpuwatch run` wrapper."""
    return paths.user_runtime_dir() / "runs" / f"{run_id}.end.json"
