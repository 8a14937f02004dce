"""Run a training script as `python SCRIPT ARGS...` would, timing what gpuwatch's zero-code hooks
take of its steps; for bench_realworld.py, under `gpuwatch run`:

    gpuwatch run -- python bench/hook_share.py SCRIPT ARGS...

Between the WARM_UP-th and the last recorded step, the time inside the hooks (outermost calls only:
the module-call enter/leave, our wrappers of backward, of DataLoader iterators' __next__ and of
torch.save and of GradScaler.scale less the torch call inside each, the optimiser-step pre- and post-hooks, Run.step and
mark_compute, and the events built from steps on gpuwatch's own drainer thread)
over the wall time. Timing a step in two separate processes cannot resolve a few per cent on a
shared machine (two plain runs of one script differ more than that); this share can. A framework
callback's own code (HF, Lightning) is not timed, only the Run.step it calls. Writes
{"steps", "hook_s", "wall_s", "by_hook"} as JSON to $HOOK_SHARE_OUT at exit (by_hook: the seconds
of each outermost hook, so a row's cost can be traced to the hook that makes it). With
$HOOK_SHARE_FLOOR set, the same for the floor's hooks (floor_hooks.py) in place of ours, which
only see a one-optimiser step: the least any hooks cost on this script.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time

from gpuwatch.client.run import Run
from gpuwatch.integrations.autohook import AutoInstrument

WARM_UP = 10  # steps left out (at most a third of them): first calls, and the hooks' own checks
# of the first iterations (see autohook.TRUSTED_AFTER)
_clock = time.perf_counter
_by_hook: dict[str, float] = {}  # inside the hooks so far, on any thread, by the outermost hook timed
_depth = threading.local()
_steps: list[tuple[float, dict]] = []  # (when a step was recorded, _by_hook then)


def _timed(fn, name: str):
    def timed(*args, **kwargs):
        if getattr(_depth, "in_hook", False):
            return fn(*args, **kwargs)
        _depth.in_hook = True
        _depth.name = name
        started = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            _by_hook[name] = _by_hook.get(name, 0.0) + _clock() - started
            _depth.in_hook = False
            if getattr(_depth, "stepped", False):
                # A step recorded inside this hook is marked as it ends, with all of its time
                # counted: marked inside, a backward wrapper (where a loop with no optimiser
                # steps) would have had its torch call taken out and not yet its own time
                # added, and the window would gain or lose one backward's time.
                _depth.stepped = False
                _steps.append((_clock(), dict(_by_hook)))

    return timed


def _timed_wrapper(wrap, name: str):
    """One of our wrappers of a torch function (`wrap(hooks, original)`: backward, a DataLoader
    iterator's __next__, torch.save), timed less the torch call inside it (whose hooks are timed
    on their own)."""

    def wrapping(hooks, original):
        def torch_call(*args, **kwargs):
            _depth.in_hook = False  # torch's code is not ours: hooks inside it count
            name = _depth.name  # (a hook inside it names another)
            started = _clock()
            try:
                return original(*args, **kwargs)
            finally:
                _by_hook[name] = _by_hook.get(name, 0.0) - (_clock() - started)
                _depth.in_hook = True

        return _timed(wrap(hooks, torch_call), name)

    return wrapping


def _marking_steps(step):
    def marked(*args, **kwargs):
        result = step(*args, **kwargs)
        _depth.stepped = True  # marked by the outermost hook of ours as it ends (see _timed)
        return result

    return marked


def _report() -> None:
    first = min(WARM_UP, len(_steps) // 3)
    if len(_steps) - first < 2:
        return
    (t0, by0), (t1, by1) = _steps[first], _steps[-1]
    by_hook = {name: spent - by0.get(name, 0.0) for name, spent in by1.items()}
    figures = {"steps": len(_steps) - 1 - first, "hook_s": sum(by_hook.values()), "wall_s": t1 - t0}
    with open(os.environ["HOOK_SHARE_OUT"], "w") as out:
        json.dump({**figures, "by_hook": by_hook}, out)


if os.environ.get("HOOK_SHARE_FLOOR"):
    # The floor's hooks in place of ours (bench/floor_hooks.py): what any hooks cost on this script.
    from floor_hooks import floor_hooks

    from gpuwatch.integrations import autohook

    _floor = floor_hooks(autohook)
    for _name in ("_enter", "_leave", "_before_optimizer_step", "_wrap_backward"):
        setattr(AutoInstrument, _name, _floor.__dict__[_name])
    AutoInstrument._on_optimizer_step = _marking_steps(_floor._on_optimizer_step)  # (no Run.step)
    for _name in ("_wrap_next", "_wrap_save", "_wrap_scale"):
        setattr(AutoInstrument, _name, lambda hooks, original: original)
for _name in ("_enter", "_leave", "_reached_model", "_before_optimizer_step", "_on_optimizer_step"):
    setattr(AutoInstrument, _name, _timed(getattr(AutoInstrument, _name), _name.strip("_")))
for _name in ("_wrap_backward", "_wrap_next", "_wrap_save", "_wrap_scale"):
    setattr(
        AutoInstrument, _name, _timed_wrapper(getattr(AutoInstrument, _name), _name.removeprefix("_wrap_"))
    )
Run.mark_compute = _timed(Run.mark_compute, "mark_compute")
Run._drain = _timed(Run._drain, "drain")  # also where gpuwatch's drainer thread turns steps into events
# (the floor marks its steps at the optimiser step: a framework's callback calling Run.step too
# would mark each of them twice, and halve its µs a step)
Run.step = _timed(Run.step if os.environ.get("HOOK_SHARE_FLOOR") else _marking_steps(Run.step), "step")
atexit.register(_report)

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
