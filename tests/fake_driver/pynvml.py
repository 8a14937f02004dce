"""`import pynvml` answered by tests/fake_pynvml.py, for gpuwatch commands that tests run as
child processes (put this directory first on PYTHONPATH). FAKE_NVML_GPUS GPUs (8), and the
comma-separated pids in FAKE_NVML_PIDS spread over them as compute processes."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fake_pynvml  # noqa: E402

_gpus = int(os.environ.get("FAKE_NVML_GPUS", "8"))
_pids = [int(p) for p in os.environ.get("FAKE_NVML_PIDS", "").split(",") if p]
fake_pynvml.configure(gpus=_gpus, procs={i: _pids[i::_gpus] for i in range(_gpus)})
sys.modules[__name__] = fake_pynvml  # `import pynvml` hands back the fake itself
