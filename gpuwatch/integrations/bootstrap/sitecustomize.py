"""Put first on a child's PYTHONPATH by `gpuwatch run`: instruments the program when, and only
when, it imports torch (and Hugging Face's generate(), when it imports transformers).

Python imports one `sitecustomize` at start-up; this one runs the user's own (the next one on
sys.path) and then only adds a tiny import watcher. gpuwatch itself is imported after torch is,
so a program that never imports torch pays for nothing but this file.
"""

import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_users_sitecustomize() -> None:
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        import sitecustomize  # noqa: F401 — the user's own, if there is one
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a watched module has finished importing (the loader is wrapped).

    A callback is dropped only once it ran: `importlib.util.find_spec("torch")` before
    `import torch` (transformers, datasets and evaluate do it) asks for a spec that is never
    executed, and the import that follows must still be seen."""

    def __init__(self, callbacks: dict) -> None:
        self._callbacks = callbacks

    def find_spec(self, name, path=None, target=None):
        callback = self._callbacks.get(name)
        if callback is None:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_callback(module):
            exec_module(module)
            loader.exec_module = exec_module
            if self._callbacks.pop(name, None) is not None:
                if not self._callbacks and self in sys.meta_path:
                    sys.meta_path.remove(self)
                _safely(callback, module)

        loader.exec_module = exec_then_callback
        return spec


def _safely(callback, module) -> None:
    try:
        callback(module)
    except Exception as e:  # noqa: BLE001 — our failure must never become the program's
        print(f"gpuwatch: automatic instrumentation is off ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)


def _on_torch(torch) -> None:
    from gpuwatch.integrations import autohook

    autohook.install(torch)


def _on_hf_trainer(module) -> None:
    from gpuwatch.integrations import hf

    hf.add_to_trainers(module)


def _on_lightning_trainer(module) -> None:  # the package: our callback subclasses its Callback
    from gpuwatch.integrations import lightning

    lightning.add_to_trainers(module)


def _on_generation_utils(module) -> None:
    from gpuwatch.integrations import autohook

    hooks = autohook.active()
    if hooks is not None:
        module.GenerationMixin.generate = hooks.wrap_generate(module.GenerationMixin.generate)


_run_users_sitecustomize()
# autohook.ENV_INSTRUMENT, read without importing gpuwatch at every Python start-up.
if os.environ.get("GPUWATCH_INSTRUMENT", "1").strip().lower() not in ("0", "false", "no", "off"):
    sys.meta_path.insert(0, _AfterImport({"torch": _on_torch,
                                          "transformers.generation.utils": _on_generation_utils,
                                          # the frameworks' Trainers get our callback added
                                          "transformers.trainer": _on_hf_trainer,
                                          "lightning.pytorch": _on_lightning_trainer}))
