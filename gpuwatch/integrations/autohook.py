"""Zero-code instrumentation: torch's own global hooks turn an unmodified training loop into
the steps of a run, and leave nothing behind on the program's objects.

The bootstrap (`bootstrap/sitecustomize.py`) calls `install()` once the program has imported
torch. Two process-global module hooks (torch keeps them in its own module, never on a model)
see each top-level module call. For the length of that call they take themselves out of torch's
global hook tables and put a one-shot "forward ended" hook on the called module, which removes
itself and puts the global ones back. So submodules run torch's hook-free fast path (the per-step
cost does not grow with the model), a copy or pickle taken between calls finds nothing of ours,
and code that torch.compile traces inside a forward always sees the same, empty, global tables:
no guard of dynamo's changes and nothing is recompiled.

A step is an optimiser step that follows at least one training forward (several optimisers in
one iteration count once). A program that never made an optimiser updates its parameters by
hand: there a step is each backward through the trained model's output (autograd tells us, via
a hook on that output's graph node, which vanishes with the graph). The loss is the one the model
returned, else the scalar the program called backward() on, with AMP's GradScaler scale undone.
With an optimiser, that hook is left off once TRUSTED_AFTER iterations in a row had one backward
through the model per forward of it, until an iteration breaks that pattern (its loss is then
not known, rather than wrong). A model that returns its loss needs neither the check nor its
backward roots: the loss it returned is the step's. Nor do several optimisers (a GAN): each
one's loss is the roots backward() was called on since the previous optimiser step.

A process the program started (a multiprocessing worker, a fork) records nothing until its
first training forward: it then trains beside its siblings (Hogwild, A3C, the ranks of
torch.multiprocessing.spawn) and records a run of its own in the `gpuwatch run` job. A DataLoader
worker never does: its transforms are module calls too.

Any error in these hooks switches them all off with one warning line: the user's program must
never break because of us.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpuwatch.client import metadata
from gpuwatch.client import run as run_mod
from gpuwatch.integrations.accounting import (
    StepTally,
    count_forward,
    find_tokens,
    flops_per_token,
    is_scalar_float,
    model_shape,
    packed,
    plain_config,
    precision_of,
    sequence_first,
    sum_losses,
    trained_params,
)
from gpuwatch.integrations.iteration import OptimizerCycle, StepSplit, name_optimizers

# "0" (or false/no/off): the bootstrap leaves the program alone; `gpuwatch run --no-instrument`.

_active: "AutoInstrument | None" = None
# Iterations in a row whose every backward() ran through the model's output, once per forward of
# it, after which the hook that checks this (the costliest part of a step) is no longer put on.
TRUSTED_AFTER = 8
# A batch fetched at most this long before the first training forward is that forward's: the first
# step begins as it was asked for, so a DataLoader's start (its workers, the first batch) is data.
FIRST_BATCH_GAP_S = 1.0


def _note_fork() -> None:
    """A forked child inherits the hooks, not the run: see AutoInstrument.forked."""
    if _active is not None:
        _active.forked()


os.register_at_fork(after_in_child=_note_fork)


class Candidate(NamedTuple):
    """A top-level training module of the first iteration, until the model is chosen."""

    module: Any
    tally: StepTally
    seq_first: bool  # it takes (seq_len, batch) inputs


class Framework(NamedTuple):
    """The model a framework callback records (see stand_aside), and the tally it reads."""

    model: Any
    tally: StepTally | None


class Scaled(NamedTuple):
    """GradScaler.scale's latest scalar output (weakly) and the scale it applied."""

    output: weakref.ref
    scale: Any


class Patch(NamedTuple):
    """A torch function we wrapped, to put back at switch-off."""

    owner: Any
    name: str
    original: Any


@dataclass(slots=True)
class Closure:
    """This step's closure (LBFGS): how often it was evaluated, and its first result."""

    evals: int = 0
    first: Any = None


def install(torch) -> "AutoInstrument | None":
    """Hook torch (once per process); None when already installed."""
    global _active
    if _active is not None:
        return None
    _active = AutoInstrument(torch)
    _active.install()
    return _active


def active() -> "AutoInstrument | None":
    return _active


def uninstall() -> "AutoInstrument | None":
    """Remove the hooks and forget them (the run, if any, is the caller's to end); returns them.
    gpuwatch.autolog() does this to start afresh: the next training forward finds the model again."""
    global _active
    hooks, _active = _active, None
    if hooks is not None:
        hooks.switch_off()
    return hooks


class AutoInstrument:
    def __init__(self, torch) -> None:
        self.torch = torch
        self._nn: Any = None  # torch.nn.modules.module, once installed
        self.name: str | None = None  # of the runs these hooks start (gpuwatch.autolog's name=)
        self._pre_id = self._post_id = None
        self._handles: list = []
        self._off = False
        # The hooks record this process's training: not after switch-off, in a child process
        # until it trains (see _wake), or once the script tracks itself. An attribute, read at
        # every hook: a call costs more.
        self._mine = True
        # In a process the program started (a multiprocessing worker, a fork), until its first
        # training forward tells whether it trains or loads data (see _wake).
        self._waiting = False
        self._process: str | None = None  # a fork's name, once it trains (a worker has its own)
        self._patched: list[Patch] = []
        self._out_of_dynamo = False  # our hooks run eagerly even when called from compiled code
        self._optimizers: weakref.WeakSet = weakref.WeakSet()  # every optimiser made since install
        self._forked = False  # a child forked from the program: its run begins at its first step
        self._forget_training()

    def _forget_training(self) -> None:
        """No training seen yet: the state of the run these hooks record, and of its iteration."""
        self.run: run_mod.Run | None = None
        self.model = None  # the outermost module, once found
        self.tally = StepTally()
        self._candidates: dict[int, Candidate] = {}  # by id(module), until the model is found
        self._seq_first = False  # the model takes (seq_len, batch) inputs
        self._fpt = None
        self._framework: Framework | None = None  # a framework callback records this training
        self._holders: dict[int, bool] = {}  # see _calls_model
        self._optimizer_made: bool | None = None  # decided at the first backward through the model
        self._through_model = False  # the running backward reached the model's output
        # Training forwards since the last backward: the check of the line above sits on the
        # 1st, 2nd, 4th, 8th… one's output, so REINFORCE's hundreds of forwards a backward (one
        # per environment step) carry a handful of autograd hooks, not one each.
        self._since_backward = 0
        # The latest training forward's output when it got no check (not a power of two): the
        # backward checks it then, as a DQN's training forward follows its acting ones.
        self._unchecked = None
        self._backward_depth = 0  # reentrant checkpointing runs backward() inside a backward
        self._in_flight = None  # the running backward's root, until it ends or a step takes it
        self._backwards = 0  # backward() calls in this iteration
        self._unreached = False  # one of them did not run through the model's output
        self._clean = 0  # iterations in a row like TRUSTED_AFTER says; -1: one broke the pattern since
        self._open = None  # the module whose top-level forward is under way
        self._scaled: Scaled | None = None
        self._cycle = OptimizerCycle()
        self._trained: list = []  # weakrefs to the top-level modules trained in the first iteration
        self._trained_parts: weakref.WeakSet | None = None  # their modules, once asked (see _trains)
        self._segment: list = []  # backward() roots since the last optimiser step (unscaled)
        self._closure: Closure | None = None
        self._reevaluating = False  # a closure optimiser's second or later evaluation runs
        self.split = StepSplit()
        self._aside_open = False  # an evaluation forward or a save is timed as such
        self._thread = threading.get_ident()  # the training thread: the one that imported torch
        self._framework_run = None  # a framework callback's run, for its first forward's shape
        self._training_data: set[int] = set()  # id()s of datasets whose batches fed a training forward
        self._last_data: int | None = None  # the dataset of the latest batch fetched
        self._began: float | None = None  # a fork's first training forward (its run's first step)
        self._fetched: tuple[float, float] | None = None  # the latest batch fetch before the run began
        self._fork_shape: dict | None = None  # and that forward's shape, for its run

    # ---- set-up and tear-down ----------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._nn = nn_module
        # Looked up once: every top-level forward asks (and a bound method is a new object each time).
        self._compiling = self.torch.compiler.is_compiling
        self._tracing = self.torch._C._get_tracing_state
        self._grad_enabled = self.torch.is_grad_enabled
        self._tensor = self.torch.Tensor
        self._enter_hook, self._leave_hook = self._enter, self._leave
        pre = nn_module.register_module_forward_pre_hook(self._enter_hook)
        post = nn_module.register_module_forward_hook(self._leave_hook, with_kwargs=True, always_call=True)
        self._pre_id, self._post_id = pre.id, post.id
        self._handles = [
            pre,
            post,
            optim_module.register_optimizer_step_post_hook(self._on_optimizer_step),
            optim_module.register_optimizer_step_pre_hook(self._before_optimizer_step),
        ]
        from torch.utils.data import get_worker_info

        self._worker_info = get_worker_info
        if metadata.worker_name() is not None:  # a process multiprocessing started
            self._mine, self._waiting = False, True  # see _wake
        self._patch(nn_module, "_has_any_global_hook", self._wrap_has_any_global_hook)
        self._patch(optim_module.Optimizer, "__init__", self._wrap_optimizer_init)
        self._patch(self.torch, "save", self._wrap_save)
        from torch.utils.data import dataloader

        self._patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._patch(self.torch, "compile", self._wrap_torch_compile)
        self._patch(self.torch.autograd, "backward", self._wrap_backward)
        scaler = getattr(getattr(self.torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._patch(scaler, "scale", self._wrap_scale)
        run_mod.on_explicit_track(self._script_tracks_itself)

    def _patch(self, owner, name: str, wrap) -> None:
        original = getattr(owner, name, None)
        if original is not None:
            self._patched.append(Patch(owner, name, original))
            setattr(owner, name, wrap(original))

    def switch_off(self, error: BaseException | None = None) -> None:
        """Remove every hook; with an error, say so in one line (the program goes on)."""
        if self._off:
            return
        self._off = True
        self._mine = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched = []
        if error is not None:
            print(
                f"gpuwatch: automatic instrumentation switched off after an error in its hooks "
                f"({type(error).__name__}: {error}); the program continues untouched",
                file=sys.stderr,
                flush=True,
            )

    def forked(self) -> None:
        """In a child forked from the program: the parent's run and iteration are not this
        process's (it must never touch that run); it records nothing until it trains (_wake), and
        its run begins at its first step: a Pool worker that only calls the model (left in
        training mode) leaves no run, where one would end as killed when the Pool ends it."""
        self._forget_training()
        self._mine, self._waiting = False, not self._off
        self._forked = True

    def _wake(self, module) -> bool:
        """In a process the program started (a multiprocessing worker, a fork), at a module
        call: whether this is its first training forward. It then trains beside its siblings (a
        Hogwild or A3C worker, a rank of `torch.multiprocessing.spawn`): a run of its own, in the
        wrapper's job. A DataLoader worker records nothing, for good: its transforms are
        training-mode module calls too."""
        if self._worker_info() is not None:
            self._waiting = False
            return False
        if not (module.training and self._grad_enabled()):
            return False
        if not any(p.requires_grad for p in module.parameters()):
            return False  # a transform, or a frozen module: not training
        self._mine, self._waiting = True, False
        self._thread = threading.get_ident()
        if self._forked:  # its first step is timed from here (see forked)
            self._began = time.perf_counter()
            self.split.restart(self._began)
        if metadata.worker_name() is None:  # a fork of the program's own (a worker has its name)
            self._process = f"pid{os.getpid()}"
        return True

    def _script_tracks_itself(self) -> None:
        """gpuwatch.track() began: the script's own calls count its steps, so ours stand down."""
        if self._waiting:  # a child process of the program tracks itself: ours stay out of it
            self.switch_off()
        if not self._mine:  # (a DataLoader worker, or hooks already off)
            return
        if self.run is not None:
            self.run.abandon()
        self.switch_off()

    def stand_aside(self, model=None, tally: StepTally | None = None, run=None) -> None:
        """A framework callback records the training of `model` (its own steps and loss): make
        no steps of ours, only count that model's training forwards into `tally` when given (the
        callback then puts no hook on the model), and tell `run` the first one's shape (for an
        OOM postmortem). stand_aside() again when the training ends."""
        self._framework = None if model is None else Framework(model, tally)
        self._holders = {}
        self._trained_parts = None
        self._framework_run = run
        if model is not None and self._waiting:  # a framework trains in this child process
            self._mine, self._waiting = True, False
        self.split.restart()
        self._candidates.clear()
        self.tally.reset()
        self._backwards, self._unreached = 0, False

    def adopt(self, run) -> None:
        """Make the steps of a framework callback's `run` (Lightning's manual optimisation: the
        program's own optimiser steps, recorded as in a plain loop); None when its training ends."""
        self._forget_training()
        self.run = run
        if run is not None and self._waiting:  # a framework trains in this child process
            self._mine, self._waiting = True, False

    # ---- the run ------------------------------------------------------------------------
    def ensure_run(self, module, args=(), kwargs=None, params=()) -> run_mod.Run:
        """The run these hooks record, started from the trained module, or from an optimiser's
        `params` where no module was seen (module None: see _step_unseen)."""
        if self.run is None:
            config = {}
            inner = None
            if module is not None:
                inner = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: the model in it
                config = plain_config(getattr(inner, "config", None)) or {}
                # batch, seq_len, heads, attention: known before the first step, for an OOM postmortem
                config.update(
                    self._fork_shape or model_shape(inner, *find_tokens(args, kwargs), packed(kwargs))
                )
            # the model's first parameter (else an optimiser's): its precision is the run's
            first = next(iter(params) if inner is None else inner.parameters(), None)
            precision = _precision(self.torch, first)
            config.setdefault("precision", precision)  # what the OOM advice weighs activations in
            # What the optimisers made so far train: every trained module (a GAN's D and G), not an
            # EMA copy the model holds (timm's task), nor a LoRA model's frozen weights.
            config.setdefault("n_params", trained_params(list(self._optimizers), inner))
            began, fetched = self._began, self._fetched
            if began is None and fetched is not None and time.perf_counter() - fetched[1] < FIRST_BATCH_GAP_S:
                began = fetched[0]  # the first step begins as its batch is asked for: its wait is data
            self.run = run_mod.start_run(
                name=self.name,
                config=config,
                precision=precision,
                flops_per_token=lambda seq_len: self._fpt and self._fpt(seq_len),
                process=self._process,
                began=began,
            )
            if self._began is None:
                self.split.restart(began)  # the first step is timed from here, as the run times it
                if began is not None and fetched is not None:
                    self.split.loader(fetched[1] - fetched[0])
        return self.run

    # ---- top-level module calls -------------------------------------------------------------
    # While a top-level forward runs, our global hooks are out of torch's tables and a one-shot
    # hook on the called module (under the same id) brings them back when it returns or raises.
    def _enter(self, module, args) -> None:
        if self._compiling() or self._tracing():
            return  # traced by dynamo, jit or export: a no-op, leaving nothing in the graph
        if not self._mine and not (self._waiting and self._wake(module)):
            return
        nn = self._nn
        post_id = self._post_id
        nn._global_forward_pre_hooks.pop(self._pre_id, None)
        nn._global_forward_hooks.pop(post_id, None)
        module._forward_hooks[post_id] = self._leave_hook
        module._forward_hooks_with_kwargs[post_id] = True
        module._forward_hooks_always_called[post_id] = True
        self._open = module
        try:
            if not (module.training and self._grad_enabled()):
                # An evaluation forward of a trained model, between two steps: time of its own.
                if self._trains(module) and self.split.aside_begin():
                    self._aside_open = True
                return
            if self._framework is not None:
                model = self._framework.model
                if module is not model and getattr(module, "_orig_mod", None) is not model:
                    if self._calls_model(module):  # (sentence-transformers' loss calls the model)
                        self._unstrand()  # our hooks back for its length: the model's call is seen
                    return
            elif self.run is None and (self.model is None or module is self.model):
                if not self._forked:  # opened before the first forward: an OOM in it gets its postmortem
                    self.ensure_run(module, args)
                elif self._fork_shape is None:  # a fork's run begins at its first step (see forked)
                    self._fork_shape = model_shape(
                        getattr(module, "_orig_mod", module), *find_tokens(args, None)
                    )
            # A training forward (of any module: a GAN's D first) begins the iteration's compute;
            # the split's data wait, worked out off this thread, is the run's (see StepSplit).
            split = self.split
            if split.compute is None:  # split.compute_began(), inlined: every step
                split.compute = split.clock()
            if self._last_data is not None:
                # The latest batch fetched was training data (a loader over another dataset,
                # between steps, is an evaluation's).
                self._training_data.add(self._last_data)
                self._last_data = None
        except Exception as e:  # noqa: BLE001
            self.switch_off(e)

    def _calls_model(self, module) -> bool:
        """Whether `module` holds the framework's model (a loss module that calls it inside:
        sentence-transformers'), asked once a module."""
        held = self._holders.get(id(module))
        if held is None:
            held = self._holders[id(module)] = any(m is self._framework.model for m in module.modules())
        return held

    def _trains(self, module) -> bool:
        """Whether `module` is one the program trains (its model, a GAN's other module, the
        framework's model) or a part of one (x-transformers' generate() calls its wrapper's net)."""
        if module is self.model or (self._framework is not None and module is self._framework.model):
            return True
        if self._trained_parts is None:
            trained = [m for m in (ref() for ref in self._trained) if m is not None]
            if self._framework is not None:
                trained.append(self._framework.model)
            if not trained:
                return False  # (the first iteration: the model is not known yet)
            self._trained_parts = weakref.WeakSet(m for t in trained for m in t.modules())
        return module in self._trained_parts

    def _leave(self, module, args, kwargs, output) -> None:
        """Also called when the forward raised (output None): before an OOM reaches the run."""
        if self._compiling():
            return
        post_id = self._post_id
        if module._forward_hooks.pop(post_id, None) is None:
            return  # called from torch's global table: a call we did not enter (traced, off)
        module._forward_hooks_with_kwargs.pop(post_id, None)
        module._forward_hooks_always_called.pop(post_id, None)
        self._open = None
        if self._off:
            return
        # _restore_globals(), inlined (a call of ours costs about a µs with the caches cold here)
        nn = self._nn
        nn._global_forward_pre_hooks[self._pre_id] = self._enter_hook
        nn._global_forward_hooks[post_id] = self._leave_hook
        if self._aside_open:
            self._aside_open = False
            self.split.aside_end()
        if not (module.training and self._grad_enabled()) or self._reevaluating:
            return  # (a closure's re-evaluations: the step's inputs were counted at the first)
        try:
            if self._framework is not None:  # the framework's steps: its callback reads this tally
                model, tally = self._framework
                if module is model or getattr(module, "_orig_mod", None) is model:  # (compiled)
                    if self._framework_run is not None:  # its first forward: before an OOM in it
                        run, self._framework_run = self._framework_run, None
                        inner = getattr(module, "_orig_mod", module)
                        run.note_shape(
                            **model_shape(inner, *find_tokens(args, kwargs), packed(kwargs)),
                            precision=_precision(self.torch, next(inner.parameters(), None)),
                        )
                    if tally is not None:
                        count_forward(tally, args, kwargs, output)
                return
            if module is self.model:
                tally, seq_first = self.tally, self._seq_first
            elif self.model is None:
                _, tally, seq_first = self._candidates.get(id(module)) or self._candidate(
                    module, args, kwargs
                )
            else:
                return
            if count_forward(tally, args, kwargs, output, seq_first) is not None and self._optimizer_made:
                return  # the model's loss and the optimiser's steps: its backward tells nothing more
            if self._clean >= TRUSTED_AFTER or (self._optimizer_made and self._cycle.several()):
                # each backward() runs through this model's output: no need to check; with several
                # optimisers (a GAN), each one's loss is the roots backward() was called on since the
                # previous step, whatever they ran through
                return
            since = self._since_backward = self._since_backward + 1
            if since & (since - 1):
                self._unchecked = output
                return  # (not a power of two: see _since_backward)
            self._unchecked = None
            self._check_reaches(output)
        except Exception as e:  # noqa: BLE001 — never the user's problem
            self.switch_off(e)

    def _candidate(self, module, args, kwargs) -> Candidate:
        """A top-level training module of the first iteration; the first one also completes the
        run's shape (inputs given by keyword are seen only here, before an OOM reaches the run)."""
        inner = getattr(module, "_orig_mod", module)
        candidate = self._candidates[id(module)] = Candidate(module, StepTally(), sequence_first(inner))
        if self.run is not None and len(self._candidates) == 1:
            shape = model_shape(inner, *find_tokens(args, kwargs), packed(kwargs))
            self.run.note_shape(shape.get("batch"), shape.get("seq_len"))
        return candidate

    def _unstrand(self) -> None:
        """A forward left by a BaseException (Ctrl-C) skips torch's always-called hooks: once the
        program goes on to a backward or an optimiser step, take our one-shot hook off it."""
        module, self._open = self._open, None
        if module is not None:
            for table in (
                module._forward_hooks,
                module._forward_hooks_with_kwargs,
                module._forward_hooks_always_called,
            ):
                table.pop(self._post_id, None)
            self._restore_globals()

    def _restore_globals(self) -> None:
        nn = self._nn
        if nn is None or self._off:
            return
        # (Setting a key that is there keeps its place: no need to look first.)
        nn._global_forward_pre_hooks[self._pre_id] = self._enter_hook
        nn._global_forward_hooks[self._post_id] = self._leave_hook

    def _wrap_has_any_global_hook(self, original):
        """torch.compile(module) warns about global hooks firing for its wrapper: ours know it."""
        nn = self._nn

        def has_any_global_hook_but_ours():
            ours = {self._pre_id, self._post_id}
            return bool(
                nn._global_backward_pre_hooks
                or nn._global_backward_hooks
                or set(nn._global_forward_pre_hooks) - ours
                or set(nn._global_forward_hooks) - ours
            )

        return has_any_global_hook_but_ours

    def _wrap_torch_compile(self, compile_):
        """Compiled code may call every hook of ours: the module hooks (`model.compile()` compiles
        the module's whole call), the backward, GradScaler and optimiser-step ones (a training
        step compiled whole, a compiled optimiser step). Dynamo must not trace them: their
        bookkeeping would be compiled away and guarded on, and each would count as a compiled
        frame. At the first torch.compile (which imports dynamo: a program that never compiles
        never pays for that import) they are put behind torch.compiler.disable, which runs them
        eagerly, as if no compiler were there."""

        def recorded_torch_compile(*args, **kwargs):
            compiled = compile_(*args, **kwargs)
            if not self._out_of_dynamo and not self._off:
                self._out_of_dynamo = True
                try:
                    self._keep_out_of_dynamo()
                except Exception as e:  # noqa: BLE001
                    self.switch_off(e)
            return compiled

        recorded_torch_compile.__wrapped__ = compile_
        return recorded_torch_compile

    def _keep_out_of_dynamo(self) -> None:
        disable = self.torch.compiler.disable
        for owner, name, original in self._patched:
            if name in ("backward", "scale"):
                setattr(owner, name, disable(getattr(owner, name)))
        from torch.optim import optimizer as optim_module

        for hooks, handle in (
            (optim_module._global_optimizer_post_hooks, self._handles[2]),
            (optim_module._global_optimizer_pre_hooks, self._handles[3]),
        ):
            hooks[handle.id] = disable(hooks[handle.id])
        # The module hooks stay inlinable (traced, they are no-ops: see _enter), so a step compiled
        # whole keeps its one graph; where dynamo meets them as frames of their own (the module
        # call that `model.compile()` compiles is run, not traced), those frames are skipped.
        try:
            from torch._C._dynamo.eval_frame import set_code_exec_strategy
            from torch._dynamo.types import FrameAction, FrameExecStrategy
        except ImportError:  # another torch: those frames are traced, to nothing
            return
        for hook in (AutoInstrument._enter, AutoInstrument._leave):
            set_code_exec_strategy(hook.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))

    def _choose_model(self) -> bool:
        """At the first step: the top-level training module with the most parameters (the model,
        not a loss module called beside it)."""
        if not self._candidates:
            return False
        module, tally, seq_first = max(
            self._candidates.values(), key=lambda c: _n_params(c.module.parameters())
        )
        self._trained = [weakref.ref(c.module) for c in self._candidates.values()]
        self._trained_parts = None
        self._candidates.clear()
        self.model, self.tally, self._seq_first = module, tally, seq_first
        self._fpt = flops_per_token(getattr(module, "_orig_mod", module))
        if self.run is None:  # a fork's (see forked)
            self.ensure_run(module)
        return True

    # ---- backward -------------------------------------------------------------------------
    def _reached_model(self, grad_outputs) -> None:
        self._through_model = True

    def _check_reaches(self, output) -> None:
        """Whether the next backward runs through `output`: a hook on its autograd node (the node
        dies with the graph: nothing stays behind)."""
        grad_fn = _first_grad_fn(output)
        if grad_fn is not None:
            grad_fn.register_prehook(self._reached_model)

    def _check_unchecked(self) -> None:
        """A backward after a forward that got no check: does it run through that one's output?"""
        output, self._unchecked = self._unchecked, None
        try:
            self._check_reaches(output)
        except Exception as e:  # noqa: BLE001
            self.switch_off(e)

    def _wrap_backward(self, backward):
        def recorded_backward(tensors, *args, **kwargs):
            if self._backward_depth:  # a reentrant checkpoint's inner backward: not an iteration
                return backward(tensors, *args, **kwargs)
            if self._open is not None:
                self._unstrand()
            if self._clean < TRUSTED_AFTER:  # (what checks an iteration: none once trusted)
                self._through_model = False
                self._since_backward = 0
                if self._unchecked is not None:
                    self._check_unchecked()
            self._backwards += 1
            self._backward_depth = 1
            loss = None  # the root, detached and unscaled once: the segment's and the tally's
            if self._framework is None and not (
                # (read by nobody in a step of the sole optimiser whose model returned its loss, as
                # nanoGPT's and Hugging Face's do: that loss is the step's)
                self.tally.losses and self._cycle.sole is not None and self._closure is None
            ):
                # loss.backward() gave no gradient: autograd then took a one-element float tensor,
                # no attribute of it to read (every step, with the caches the backward left cold)
                gradient = args[0] if args else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
                if gradient is None and type(tensors) is self._tensor or is_scalar_float(tensors):
                    scaled = self._scaled
                    if scaled is not None and scaled.output() is tensors:
                        loss = tensors.detach() / scaled.scale  # GradScaler's scale undone
                    elif tensors.is_cpu:
                        # its value now (no wait on the CPU): one tensor op, where a detached
                        # copy read at the step would cost two, with the caches a step left cold
                        try:
                            loss = tensors.item()
                        except Exception:  # noqa: BLE001 — not one element (torch's backward says so, as without us), or a subclass's own
                            loss = None
                    else:
                        loss = tensors.detach()  # (read once the GPU passed the step: no sync)
                    if self._optimizer_made or self._optimizers:
                        segment = self._segment
                        segment.append(loss)
                        if len(segment) > 64:  # a long accumulation: keep the sum, not every root
                            segment[:] = [sum_losses(segment)]
            self._in_flight = loss  # taken by an optimiser that steps inside this backward
            try:
                result = backward(tensors, *args, **kwargs)
            finally:
                self._backward_depth = 0
            loss, self._in_flight = self._in_flight, None  # (None: a step inside took it)
            if self._clean >= TRUSTED_AFTER:  # unchecked: the root counts when a forward awaits it
                through = self._backwards <= self.tally.forwards
            else:
                through = self._through_model
                if not (through or self.tally.losses):  # (a returned loss: no root to tell apart)
                    self._unreached = True
            if not (through or self.model is not None or self._candidates):
                through = True  # no training forward seen at all: see _step_unseen
            if through and self._framework is None and self._mine:
                if self._optimizer_made and self.model is not None:  # the usual, every step
                    if loss is not None:
                        self.tally.roots.append(loss)  # (_after_backward's first case)
                    return result
                try:
                    self._after_backward(loss)
                except Exception as e:  # noqa: BLE001
                    self.switch_off(e)
            return result

        recorded_backward.__wrapped__ = backward
        return recorded_backward

    def _after_backward(self, loss) -> None:
        """A backward through the model ended: its root (`loss`, unscaled, None when not a
        scalar) is the loss when the model returned none; without any optimiser in the program,
        this ends the iteration."""
        if loss is not None:
            if self.model is not None or not self._candidates:  # (none: see _step_unseen)
                self.tally.add_root(loss)
            else:
                for candidate in self._candidates.values():
                    candidate.tally.add_root(loss)
        if self._optimizer_made is None:
            self._optimizer_made = _any_optimizer_made(self.torch)
        if (
            not self._optimizer_made
            and (self.model is not None or self._choose_model())
            and self.tally.forwards
        ):
            self.run.step(*self.tally.take_args(), None, self.split.take())

    def _take_in_flight(self) -> None:
        """An optimiser steps inside backward() (a hook a parameter: torchtune's optimizer_in_bwd,
        PyTorch's tutorial on fusing the step into the backward): the running backward's root is
        this iteration's loss, not the next one's."""
        loss, self._in_flight = self._in_flight, None
        if self._through_model or self._clean >= TRUSTED_AFTER:
            self._after_backward(loss)

    def _segment_loss(self, closure: Closure | None):
        """The loss of the optimiser step that just ran: its closure's first evaluation (what
        step(closure) returned), else the backward() roots since the previous optimiser step (a
        GAN's errD_real + errD_fake), a list the cycle sums only when it reads it: with one
        optimiser, nobody does, and a gradient accumulation's roots cost no tensor op."""
        roots, self._segment = self._segment, []
        if closure is not None and closure.evals:
            first = closure.first
            return first.detach() if hasattr(first, "detach") else first
        return roots or None

    def _expected(self) -> bool:
        """Whether an optimiser over a module trained so far has not stepped yet (the first
        iteration of D, G goes on after D's step), other than one over parameters an optimiser
        stepped already: a later phase's (the whole model's, made up front beside its head's for
        a warm-up), as no iteration updates a parameter twice."""
        trained = {
            id(p)
            for ref in (*self._trained, lambda: self.model)
            if ref() is not None
            for p in ref().parameters()
        }
        stepped = set(self._cycle.order)
        optimizers = [
            (opt, {id(p) for g in opt.param_groups for p in g["params"]}) for opt in list(self._optimizers)
        ]
        done = set().union(*(params for opt, params in optimizers if id(opt) in stepped))
        return any(
            params & trained and not params & done for opt, params in optimizers if id(opt) not in stepped
        )

    def _live_optimizers(self) -> set[int]:
        return {id(opt) for opt in list(self._optimizers)}

    def _name_optimizers(self, optimizer) -> None:
        """Name each optimiser of the cycle after the module it trains (see name_optimizers)."""
        known = {id(opt): opt for opt in (*self._optimizers, optimizer)}
        modules = [m for m in (ref() for ref in (*self._trained, lambda: self.model)) if m is not None]

        def module_of(opt):
            params = {id(p) for group in opt.param_groups for p in group["params"]}
            shared = [(sum(id(p) in params for p in m.parameters()), m) for m in modules]
            best = max(shared, key=lambda c: c[0], default=(0, None))
            return best[1] if best[0] else None

        self._cycle.names = name_optimizers([known[k] for k in self._cycle.order if k in known], module_of)

    def _close_step(self, optimizer, loss, evals) -> None:
        """The iteration ended at this optimiser step: its step, with each optimiser's loss
        (`loss`: the closure's, with `evals` evaluations of it)."""
        tokens, samples, seq_len, step_loss = self.tally.take_args()
        split = self.split.take()
        if evals:
            split = split._replace(closure_evals=evals)
            step_loss = loss
        losses = None
        if self._cycle.several():
            if len(self._cycle.names) < len(self._cycle.order):
                self._name_optimizers(optimizer)
            losses = self._cycle.take() or None
            if losses:  # the step's loss is the first optimiser's of the cycle (a GAN's D)
                step_loss = next(iter(losses.values()))
                if len(losses) == 1:
                    # One backward(), then every optimiser steps (nanochat's AdamW and Muon over
                    # one model, an optimiser a layer): one loss, no losses of their own to name.
                    losses = None
        else:
            self._cycle.next_iteration()
        self.run.step(tokens, samples, seq_len, step_loss, losses, split)

    def _step_unseen(self, optimizer, loss, evals) -> None:
        """An optimiser step after a backward, with no training forward of any module seen: the
        model runs inside a function compiled whole (`torch.compile(train_step)`), or there is no
        module. A step all the same, with the loss backward() was called on, without tokens."""
        if not self._cycle.stepped(optimizer, loss, _never):
            return
        if not self._backwards:
            return  # no backward since the last step: nothing trained
        self._backwards = 0
        self.ensure_run(None, params=[p for group in optimizer.param_groups for p in group["params"]])
        self._close_step(optimizer, loss, evals)

    def _judge_iteration(self) -> None:
        """At an optimiser step: was each backward() of this iteration one through the model's
        output, one per forward of it? TRUSTED_AFTER such iterations in a row, and the check is
        left off; once an unchecked iteration breaks the pattern, it is checked for good."""
        if self._backwards == self.tally.forwards and not self._unreached:
            if 0 <= self._clean < TRUSTED_AFTER:
                self._clean += 1
        elif self._clean >= TRUSTED_AFTER:
            self._clean = -1
            self.tally.forget_roots()  # which root was the loss is unknown: better none than a wrong one
        elif self._clean > 0:
            self._clean = 0
        self._backwards, self._unreached = 0, False

    def _wrap_scale(self, scale):
        def recorded_scale(scaler, outputs):
            scaled = scale(scaler, outputs)
            try:
                # (a disabled scaler, as on the CPU, has no scale: then the loss is not read)
                if getattr(scaler, "_scale", None) is not None and is_scalar_float(scaled):
                    self._scaled = Scaled(weakref.ref(scaled), scaler._scale.detach().clone())
            except Exception as e:  # noqa: BLE001
                self.switch_off(e)
            return scaled

        recorded_scale.__wrapped__ = scale
        return recorded_scale

    # ---- every step ---------------------------------------------------------------------
    def _before_optimizer_step(self, optimizer, args, kwargs):
        """step(closure) (LBFGS): count the closure's evaluations and keep its first result."""
        if len(args) < 2 and not kwargs:  # the usual step() (args[0]: the optimiser)
            return None
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is None or not callable(closure) or self._framework is not None or not self._mine:
            return None
        counted = self._closure = Closure()

        def counted_closure(*c_args, **c_kwargs):
            first = not counted.evals
            counted.evals += 1
            self._reevaluating = not first
            try:
                result = closure(*c_args, **c_kwargs)
            finally:
                self._reevaluating = False
            if first:
                counted.first = result
            return result

        if "closure" in kwargs:
            return args, dict(kwargs, closure=counted_closure)
        return (args[0], counted_closure, *args[2:]), kwargs

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._open is not None:
            self._unstrand()
        if self._framework is not None or not self._mine:
            return
        try:
            self._optimizer_made = True
            if self._backward_depth and self._in_flight is not None:
                self._take_in_flight()
            closure, self._closure = self._closure, None
            if closure is not None and closure.first is None:
                closure = None  # one that returned nothing (Lightning's, stepping by hand): not a loss
            if (
                closure is None
                and self._cycle.sole == id(optimizer)
                and self.tally.forwards
                and self.model is not None
            ):
                # The usual step (one optimiser, after forwards of the model) ends the iteration, as
                # the cycle would say after its bookkeeping; no closure: the segment's roots are not
                # the step's loss (the tally's are).
                if self._segment:
                    self._segment = []
                if self._clean >= TRUSTED_AFTER and self._backwards == self.tally.forwards:
                    self._backwards = 0  # a trusted iteration like the others: nothing to judge
                else:
                    self._judge_iteration()
                # (nothing of the cycle's to close: it learnt the sole optimiser). Arguments by
                # position, not *unpacked: a call with exact arguments costs less.
                tokens, samples, seq_len, loss = self.tally.take_args()
                self.run.step(tokens, samples, seq_len, loss, None, self.split.take())
                return
            loss = self._segment_loss(closure)
            evals = closure.evals if closure is not None and closure.evals else None
            if self.model is None and not self._choose_model():
                self._step_unseen(optimizer, loss, evals)
                return
            # An optimiser first seen once the iteration was recorded, with no forward since: one
            # over a tensor of no module (SAC's temperature) belongs to that iteration, not to one
            # of its own (an empty step).
            late = self._cycle.learnt and not self.tally.forwards and id(optimizer) not in self._cycle.order
            if not self._cycle.stepped(optimizer, loss, self._expected, self._live_optimizers):
                return  # the iteration goes on: another optimiser of the cycle steps next
            if late:
                self._cycle.next_iteration()
                return
            if self.tally.forwards or self._cycle.several():
                self._judge_iteration()
                self._close_step(optimizer, loss, evals)
        except Exception as e:  # noqa: BLE001
            self.switch_off(e)

    # ---- the program's optimisers, data loaders and checkpoints ----------------------------
    def _wrap_optimizer_init(self, init):
        optimizers = self._optimizers

        def noted_init(optimizer, *args, **kwargs):
            init(optimizer, *args, **kwargs)
            optimizers.add(optimizer)  # weakly: the program's to keep or drop

        noted_init.__wrapped__ = init
        return noted_init

    def _wrap_next(self, next_):
        """DataLoader iterators' __next__ on the training thread: the time inside is data wait."""
        clock, get_ident = time.perf_counter, threading.get_ident

        def timed_next(iterator):
            if get_ident() != self._thread or not self._mine:
                return next_(iterator)
            split = self.split  # (a fork's is its own: see _forget_training)
            data = id(getattr(iterator, "_dataset", iterator))
            # A batch of a dataset that never fed training, once training has: an evaluation's.
            evaluation = bool(self._training_data) and data not in self._training_data and split.aside_begin()
            started = clock()
            # Module calls inside the loader are data loading (torchvision's transforms are
            # modules): neither a training forward, nor the iteration's compute begun.
            self._mine = False
            try:
                return next_(iterator)
            finally:
                self._mine = not self._off
                ended = clock()
                split.loader(ended - started)
                self._last_data = data
                if self.run is None:  # (maybe the first training forward's batch: see ensure_run)
                    self._fetched = (started, ended)
                if evaluation:
                    split.aside_end()

        timed_next.__wrapped__ = next_
        return timed_next

    def _wrap_save(self, save):
        """torch.save between steps: checkpoint time, apart from compute and data."""

        def timed_save(*args, **kwargs):
            if get_ident() != self._thread or not self._mine or not self.split.aside_begin():
                return save(*args, **kwargs)
            try:
                return save(*args, **kwargs)
            finally:
                self.split.aside_end()

        get_ident = threading.get_ident
        timed_save.__wrapped__ = save
        timed_save.__doc__ = save.__doc__
        return timed_save

    # ---- Hugging Face generate() --------------------------------------------------------
    def wrap_generate(self, generate):
        """GenerationMixin.generate, recorded as one generation per call."""
        import time

        def recorded_generate(model, *args, **kwargs):
            if not self._mine:
                return generate(model, *args, **kwargs)
            started = time.perf_counter()
            output = generate(model, *args, **kwargs)
            try:
                prompt = kwargs.get("input_ids", args[0] if args else None)
                sequences = getattr(output, "sequences", output)
                if hasattr(prompt, "shape") and hasattr(sequences, "shape"):
                    # A decoder-only model returns the prompt and what follows it; an encoder-decoder
                    # one (T5) the decoder's sequence: its start token (or given ids), then the new ones.
                    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
                        start = kwargs.get("decoder_input_ids")
                        before = start.shape[-1] if hasattr(start, "shape") else 1
                    else:
                        before = prompt.shape[-1]
                    new = max(sequences.shape[-1] - before, 0) * sequences.shape[0]
                    # a padded prompt's padding is not its tokens (generate() has waited for the GPU)
                    mask = kwargs.get("attention_mask")
                    given = (
                        int(mask.sum()) if getattr(mask, "shape", None) == prompt.shape else prompt.numel()
                    )
                    self.ensure_run(model).generation(
                        prompt_tokens=given,
                        new_tokens=new,
                        total_ms=(time.perf_counter() - started) * 1000.0,
                    )
            except Exception as e:  # noqa: BLE001
                self.switch_off(e)
            return output

        recorded_generate.__wrapped__ = generate
        recorded_generate.__doc__ = generate.__doc__
        return recorded_generate


def _never() -> bool:
    return False


def _n_params(params) -> int:
    return sum(p.numel() for p in params)


def _first_grad_fn(output):
    """The autograd node of the first tensor in a forward's output that has one."""
    if hasattr(output, "grad_fn"):
        return output.grad_fn
    if isinstance(output, dict) or hasattr(output, "values") and hasattr(output, "keys"):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for value in output:
            grad_fn = getattr(value, "grad_fn", None)
            if grad_fn is not None:
                return grad_fn
    return None


def _any_optimizer_made(torch) -> bool:
    """Whether the program has built a torch optimiser: torch marks each optimiser class's step
    as hooked when its first instance is made."""
    pending = [torch.optim.Optimizer]
    while pending:
        cls = pending.pop()
        if getattr(cls.__dict__.get("step"), "hooked", False):
            return True
        pending.extend(cls.__subclasses__())
    return False


def _precision(torch, param) -> str:
    """The dtype the matmuls run in, for MFU's peak: autocast's, else the weights' (`param`, one
    of them)."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return precision_of(torch.get_autocast_dtype(device))
    return precision_of(param.dtype if param is not None else "fp32")
