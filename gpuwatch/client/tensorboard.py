"""Start the process that mirrors this program's runs into TensorBoard files while they run
(gpuwatch/analysis/tensorboard_live.py), for `gpuwatch run --tensorboard` and
`autolog(tensorboard=...)`. It runs beside the training at nice +10 and in a session of its own
(a Ctrl-C meant for the training does not cut its last pass short); it ends once the runs have,
or once the process it watches is gone."""

from __future__ import annotations

import os
import subprocess
import sys


def start_mirror(
    target: str, *, since_ms: int, watch_pid: int, wrapper_run_id: str | None = None, pid: int | None = None
) -> subprocess.Popen[bytes]:
    """target: a directory (files go to TARGET/gpuwatch/) or "auto" (beside the program's own
    TensorBoard logs, once it writes some)."""
    who = ["--wrapper", wrapper_run_id] if wrapper_run_id else ["--pid", str(pid)]
    target = target if target == "auto" else os.path.abspath(target)
    mirror = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatch.analysis.tensorboard_live",
            target,
            *who,
            "--since",
            str(since_ms),
            "--watch-pid",
            str(watch_pid),
            "--cwd",
            os.getcwd(),
        ],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    try:
        os.setpriority(os.PRIO_PROCESS, mirror.pid, 10)
    except OSError:  # already gone: it says why on stderr
        pass
    return mirror
