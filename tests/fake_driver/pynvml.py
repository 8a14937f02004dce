"""`import pynvml` answered by tests/fake_pynvml.py, for gpuwatch commands that tests run as
child processes (put this directory first on PYTHONPATH). FAKE_NVML_GPUS GPUs (8), and the
comma-separated pids in FAKE_NVML_PIDS spread over them as compute processes; FAKE_NVML_GPM=1
gives every GPU GPM (SM activity); FAKE_NVML_PIDS_FILE names a file of pids (written by a test's
child once it knows its pid) that every GPU runs, re-read every 0.2 s."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fake_pynvml  # noqa: E402

_gpus = int(os.environ.get("FAKE_NVML_GPUS", "8"))
_pids = [int(p) for p in os.environ.get("FAKE_NVML_PIDS", "").split(",") if p]
_gpm = set(range(_gpus)) if os.environ.get("FAKE_NVML_GPM") == "1" else set()
_fake = fake_pynvml.configure(gpus=_gpus, procs={i: _pids[i::_gpus] for i in range(_gpus)}, gpm=_gpm)
_pid_file = os.environ.get("FAKE_NVML_PIDS_FILE")


def _follow_pid_file() -> None:
    while True:
        try:
            with open(_pid_file) as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pids = []
        for i in range(_gpus):
            _fake.set_procs(i, pids)
        time.sleep(0.2)


if _pid_file:
    threading.Thread(target=_follow_pid_file, name="fake-nvml-pids", daemon=True).start()
sys.modules[__name__] = fake_pynvml  # `import pynvml` hands back the fake itself
