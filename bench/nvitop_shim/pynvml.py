"""The `pynvml` nvitop imports in bench_tui.py, simulated: nvidia-ml-py's own constants and
structs (read from the real module in nvitop's venv), tests/fake_pynvml.py's GPUs, functions
and error classes; an NVML function the fake lacks raises NVMLError_NotSupported, as on a GPU
without that feature. NVITOP_FAKE_PIDS (comma-separated) spreads real pids over the 8 GPUs."""

import importlib.util
import os
import sys
import types

_here = os.path.dirname(os.path.abspath(__file__))
_path = next(
    os.path.join(p, "pynvml.py")
    for p in sys.path
    if p and os.path.abspath(p) != _here and os.path.exists(os.path.join(p, "pynvml.py"))
)
_spec = importlib.util.spec_from_file_location("_real_pynvml", _path)
_real = importlib.util.module_from_spec(_spec)
sys.modules["_real_pynvml"] = _real
_spec.loader.exec_module(_real)
sys.path.insert(0, os.environ["GPUWATCH_TESTS"])
import fake_pynvml as _fake  # noqa: E402

_pids = [int(p) for p in os.environ.get("NVITOP_FAKE_PIDS", "").split(",") if p]
_fake.configure(gpus=8, procs={i: _pids[i::8] for i in range(8)})


def _unsupported(name):
    def call(*args, **kwargs):
        raise _fake.NVMLError(_fake.NVML_ERROR_NOT_SUPPORTED)

    call.__name__ = name
    return call


for _name, _value in vars(_real).items():
    if _name.startswith("__") or _name == "_nvmlGetFunctionPointer":
        continue  # without it, nvitop calls the functions here, not its own ctypes versions
    if _name.startswith("nvml") and isinstance(_value, types.FunctionType):
        _fn = getattr(_fake, _name, None)
        globals()[_name] = _fn if callable(_fn) else _unsupported(_name)
    elif not _name.startswith("NVMLError"):
        globals()[_name] = _value
for _name in dir(_fake):
    if _name.startswith("NVMLError"):
        globals()[_name] = getattr(_fake, _name)
_fake.NVMLError._errcode_to_string = dict(_real.NVMLError._errcode_to_string)


def nvmlExceptionClass(code):
    return _fake.NVMLError._valClassMapping.get(code, _fake.NVMLError)


def nvmlInitWithFlags(flags):
    return _fake.nvmlInit()
