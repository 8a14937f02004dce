"""What one training iteration is, for the zero-code hooks: the cycle of a program's optimisers
(a GAN's D then G), each one's loss, and where the host's time between two steps went.

Kept apart from the hooks themselves (autohook.py): these are plain bookkeeping, no torch.
"""

from __future__ import annotations

import sys
import time
from types import FrameType
from typing import Any, Callable, Iterable, NamedTuple

from gpuwatch.integrations.accounting import sum_losses

# Optimiser steps past a cycle's length with no end of it: the program changed its optimisers
# (a new one replaces an old one still alive); the cycle is learnt again from those steps.
RELEARN_AFTER = 16


class OptimizerCycle:
    """The order in which the optimisers step; an iteration ends after the last of the cycle.

    Optimisers are known by id() (holding them would keep their state alive). The first
    iteration ends once no optimiser the caller still expects (one over a module trained in
    that iteration) is left to step, so D, G is one iteration and not two."""

    def __init__(self) -> None:
        self.order: list[int] = []  # ids, in the order of their first step
        self.names: dict[int, str] = {}
        self.learnt = False
        # The id of the only optimiser, once learnt: each step of it ends an iteration.
        self.sole: int | None = None
        self._open: list[int] = []  # ids stepped in the iteration under way
        self._losses: dict[int, Any] = {}  # id -> the loss of its latest step in that iteration

    def stepped(
        self, optimizer, loss, expected: Callable[[], bool], alive: Callable[[], set[int]] | None = None
    ) -> bool:
        """`optimizer` stepped with `loss` (None: none; a list: backward() roots, summed when
        read); whether the iteration ends here. `expected()`: an optimiser still to step before a
        first cycle ends; `alive()`: the ids of the optimisers the program still holds."""
        key = id(optimizer)
        if key not in self.order:
            if alive is not None:
                # A second phase's optimiser replacing the first's (head only, then the whole
                # model): the one the program let go is out of the cycle, not a partner of it.
                live = alive()
                self.order = [k for k in self.order if k in live]
                self.names = {k: name for k, name in self.names.items() if k in live}
            self.order.append(key)
            self._note_sole()
        self._open.append(key)
        if loss is not None:
            self._losses[key] = loss
        if len(self._open) > len(self.order) + RELEARN_AFTER:
            self.order = list(dict.fromkeys(self._open))
            self._note_sole()
            return True
        if key != self.order[-1]:
            return False
        if not self.learnt:
            if expected():
                return False
            self.learnt = True
            self._note_sole()
        return True

    def _note_sole(self) -> None:
        self.sole = self.order[0] if self.learnt and len(self.order) == 1 else None

    def several(self) -> bool:
        return len(self.order) > 1

    def take(self) -> dict[str, Any]:
        """The ended iteration's loss of each optimiser that had one, by name, in cycle order."""
        losses = {
            self.names.get(key) or f"opt{i}": _summed(self._losses[key])
            for i, key in enumerate(self.order)
            if key in self._losses
        }
        self.next_iteration()
        return losses

    def next_iteration(self) -> None:
        """The iteration ended and its losses are not wanted (one optimiser: the step's own)."""
        if self._open:  # (the only optimiser's steps leave nothing open: see sole)
            self._open.clear()
            self._losses.clear()


def _summed(loss):
    return sum_losses(loss) if type(loss) is list else loss


def program_name(obj, skip: tuple[str, ...] = ("torch", "gpuwatch")) -> str | None:
    """The name the program gave `obj`: a local or global variable, or an attribute of a `self`
    (or of one of its attributes: stable-baselines3's `self.actor.optimizer`), in the innermost
    frame of the program's own code (outside torch and gpuwatch) that holds it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if not module.startswith(skip):
            for name, value in frame.f_locals.items():
                if value is obj:
                    return name
            owner = frame.f_locals.get("self")
            attributes = getattr(owner, "__dict__", {})
            for name, value in attributes.items():
                if value is obj:
                    return name
            modules = getattr(owner, "_modules", None)  # an nn.Module's submodules
            for name, value in (modules or {}).items():
                if value is obj:
                    return name
            for name, value in frame.f_globals.items():
                if value is obj:
                    return name
            for name, value in attributes.items():
                for inner, held in _attributes(value):
                    if held is obj:
                        return f"{name}.{inner}"
        frame = frame.f_back
    return None


def _attributes(obj) -> list[tuple[str, Any]]:
    """An object's own attributes, [] where it keeps none it will show (slots, a proxy)."""
    try:
        held = vars(obj)
        return list(held.items()) if isinstance(held, dict) else []
    except Exception:  # noqa: BLE001 — a third-party object's __dict__ is not ours to trust
        return []


def name_optimizers(optimizers: Iterable, module_of: Callable[[Any], Any]) -> dict[int, str]:
    """id -> name for each optimiser: the program's name for the module it trains when that names
    it alone (netD, netG), else the optimiser's own name (two over one model), else optN."""
    optimizers = list(optimizers)
    by_module = [program_name(module_of(opt)) if module_of(opt) is not None else None for opt in optimizers]
    names: dict[int, str] = {}
    for i, (opt, name) in enumerate(zip(optimizers, by_module)):
        if name is None or by_module.count(name) > 1:
            name = program_name(opt)
        names[id(opt)] = name if name and name not in names.values() else f"opt{i}"
    return names


_reading = tuple.__new__


class SplitReading(NamedTuple):
    """The clock readings of one step's interval (see StepSplit), worked out into its step fields
    by fields() when gpuwatch's drainer thread reads the step: off the training loop."""

    since: float
    now: float
    loader: float
    aside: list[float] | None
    compute: float | None
    loader_in_compute: float  # of `loader`, the part after the compute began (micro-batches' fetches)
    loader_seen: bool
    closure_evals: int | None = None  # a closure optimiser's evaluations of its closure

    def fields(self) -> dict[str, float]:
        """The shares (%) of the interval, as step fields."""
        since, now, loader, aside, compute, loader_in_compute, loader_seen, closure_evals = self
        fields: dict[str, float] = {}
        if now > since:
            to_pct = 100.0 / (now - since)
            aside_s = 0.0
            if aside is not None and aside[1]:
                aside_s = aside[1] - aside[0]
                loader -= aside[3] - aside[2]  # the evaluation's own loader time
            if loader_seen:
                fields["data_wait_pct"] = _pct(loader * to_pct)
            elif compute is not None:  # no DataLoader: the time before the compute began, less evaluations
                fields["data_wait_pct"] = _pct((compute - since - aside_s) * to_pct)
            fields["eval_pct"] = _pct(aside_s * to_pct)
            if compute is not None:
                fields["compute_pct"] = _pct((now - compute - loader_in_compute) * to_pct)
        if closure_evals:
            fields["closure_evals"] = closure_evals
        return fields


class StepSplit:
    """Where the host's time between two steps went: inside the data loader (on the training
    thread; with no DataLoader, the time before the compute began, less evaluations),
    evaluation forwards and checkpoint saves before the iteration's training began ("aside";
    the loader's time inside that stretch is the evaluation's), compute (from the iteration's
    first training forward to its step, less the fetches of later micro-batches: data), and the
    rest."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.loader_seen = False  # a DataLoader was iterated: data wait is the time inside it
        self.restart()

    def restart(self, now: float | None = None) -> None:
        """The interval of the next step begins now (`now`: a clock reading just taken)."""
        self._since = self.clock() if now is None else now
        self._loader = self._loader_in_compute = 0.0
        self._aside: list[float] | None = None  # [start, end, loader time at start, at end]
        self.compute: float | None = None  # when the iteration's first training forward began

    def loader(self, seconds: float) -> None:
        self._loader += seconds
        if self.compute is not None:  # a later micro-batch's: data, not compute
            self._loader_in_compute += seconds
        self.loader_seen = True

    def aside_begin(self) -> bool:
        """An evaluation forward or a save begins; False when the iteration's compute already
        has (then it is that compute's, and aside_end need not be called)."""
        if self.compute is not None:
            return False
        if self._aside is None:
            self._aside = [self.clock(), 0.0, self._loader, self._loader]
        return True

    def aside_end(self) -> None:
        if self._aside is not None:
            self._aside[1], self._aside[3] = self.clock(), self._loader

    def compute_began(self) -> None:
        if self.compute is None:
            self.compute = self.clock()

    def take(self) -> SplitReading:
        """The readings of the interval now ended, for Run.step's split (its fields are worked
        out on the drainer thread); and a new interval."""
        now = self.clock()
        # (tuple.__new__: SplitReading's own __new__ costs more, and this is every step)
        reading = _reading(
            SplitReading,
            (
                self._since,
                now,
                self._loader,
                self._aside,
                self.compute,
                self._loader_in_compute,
                self.loader_seen,
                None,
            ),
        )
        # restart(now), inlined: a call costs a µs or more with the caches a training step left cold
        self._since, self._loader, self._loader_in_compute, self._aside, self.compute = (
            now,
            0.0,
            0.0,
            None,
            None,
        )
        return reading


def _pct(value: float) -> float:
    return 0.0 if value < 0.0 else 100.0 if value > 100.0 else value
