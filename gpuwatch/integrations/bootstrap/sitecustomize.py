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


def _not_instrumented(why: str) -> None:
    """One stderr line, and the same line left where `gpuwatch run` reads it for `gpuwatch show`."""
    print("gpuwatch: this run is not instrumented: " + why, file=sys.stderr, flush=True)
    note = os.environ.get("GPUWATCH_BOOTSTRAP_NOTE")  # integrations.child_path.ENV_NOTE
    if note:
        try:
            with open(note, "x") as f:  # the first process to fail explains; its children don't repeat
                f.write(why)
        except OSError:
            pass


def _safely(callback, module) -> None:
    try:
        callback(module)
    except ImportError as e:  # our package cannot load in this interpreter
        _not_instrumented(
            "gpuwatch could not load in {} ({}: {}); install gpuwatch into this "
            "environment (pip install gpuwatch)".format(sys.executable, type(e).__name__, e)
        )
    except SyntaxError as e:
        _not_instrumented(
            "gpuwatch's code does not compile on this Python {} ({}); run the program "
            "with Python >= 3.10".format(sys.version.split()[0], e)
        )
    except Exception as e:  # noqa: BLE001 — our failure must never become the program's
        print(
            f"gpuwatch: automatic instrumentation is off ({type(e).__name__}: {e})",
            file=sys.stderr,
            flush=True,
        )


def _on_torch(torch) -> None:
    if sys.version_info < (3, 10):  # this file itself must still load there, to say so
        _not_instrumented(
            "Python {}.{} is older than the 3.10 gpuwatch's hooks need; run the program "
            "with Python >= 3.10 to record its steps".format(*sys.version_info[:2])
        )
        return
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
# integrations.ENV_INSTRUMENT, read without importing gpuwatch at every Python start-up.
if os.environ.get("GPUWATCH_INSTRUMENT", "1").strip().lower() not in ("0", "false", "no", "off"):
    sys.meta_path.insert(
        0,
        _AfterImport(
            {
                "torch": _on_torch,
                "transformers.generation.utils": _on_generation_utils,
                # the frameworks' Trainers get our callback added
                "transformers.trainer": _on_hf_trainer,
                "lightning.pytorch": _on_lightning_trainer,
            }
        ),
    )
