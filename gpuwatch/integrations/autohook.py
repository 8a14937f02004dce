"""Zero-code instrumentation: torch's own global hooks turn an unmodified training loop into
the steps of a run.

The bootstrap (`bootstrap/sitecustomize.py`) calls `install()` once the program has imported
torch. Until the first optimiser step, global module hooks watch the top-level forwards to find
the outermost module (the trained model: the top-level module with the most parameters); then
they are removed and one forward hook stays on that module, so the per-step cost does not grow
with the number of submodules. A step is an optimiser step that follows at least one training
forward: several optimisers stepping in one iteration count once.

Any error in these hooks switches them all off with one warning line: the user's program must
never break because of us.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from gpuwatch.client import run as run_mod
from gpuwatch.integrations.accounting import (StepTally, count_forward, flops_per_token,
                                               plain_config, precision_of)

# "0" (or false/no/off): the bootstrap leaves the program alone; `gpuwatch run --no-instrument`.
ENV_INSTRUMENT = "GPUWATCH_INSTRUMENT"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")

_active: "AutoInstrument | None" = None


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
        self.run: run_mod.Run | None = None
        self.name: str | None = None  # of the runs these hooks start (gpuwatch.autolog's name=)
        self.model = None  # the outermost module, once found
        self.tally = StepTally()
        self._candidates: dict[int, tuple] = {}  # id(module) -> (module, its tally), until found
        self._depth = threading.local()
        self._handles: list = []
        self._fpt = None
        self._off = False
        self._pid = os.getpid()  # forked DataLoader workers inherit the hooks, not the run

    # ---- set-up and tear-down ----------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter),
            nn_module.register_module_forward_hook(self._leave, with_kwargs=True, always_call=True),
            optim_module.register_optimizer_step_post_hook(self._on_optimizer_step),
        ]

    def _remove(self, handles) -> None:
        for handle in handles:
            handle.remove()

    def switch_off(self, error: BaseException | None = None) -> None:
        """Remove every hook; with an error, say so in one line (the program goes on)."""
        if self._off:
            return
        self._off = True
        self._remove(self._handles)
        self._handles = []
        if error is not None:
            print(f"gpuwatch: automatic instrumentation switched off after an error in its hooks "
                  f"({type(error).__name__}: {error}); the program continues untouched",
                  file=sys.stderr, flush=True)

    def _ours(self) -> bool:
        """False in a forked child, after switch-off, or once the script tracks itself."""
        if self._off or os.getpid() != self._pid:
            return False
        if run_mod.explicit_track_started:
            if self.run is not None:
                self.run.abandon()
            self.switch_off()
            return False
        return True

    # ---- the run ------------------------------------------------------------------------
    def ensure_run(self, module) -> run_mod.Run:
        if self.run is None:
            config = plain_config(getattr(module, "config", None))
            self.run = run_mod.start_run(name=self.name, config=config, precision=_precision(self.torch, module),
                                         flops_per_token=lambda seq_len: self._fpt and self._fpt(seq_len))
        return self.run

    # ---- finding the outermost module (first iteration only) ---------------------------
    def _enter(self, module, args) -> None:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0 and self.run is None and module.training and self.torch.is_grad_enabled() \
                and self._ours():
            try:  # open the run before the first forward: an OOM in it gets its postmortem
                self.ensure_run(module)
            except Exception as e:  # noqa: BLE001
                self.switch_off(e)

    def _leave(self, module, args, kwargs, output) -> None:
        self._depth.n = depth = getattr(self._depth, "n", 1) - 1
        if depth or not self._ours() or not (module.training and self.torch.is_grad_enabled()):
            return
        try:
            _, tally = self._candidates.setdefault(id(module), (module, StepTally()))
            count_forward(tally, args, kwargs, output)
        except Exception as e:  # noqa: BLE001 — never the user's problem
            self.switch_off(e)

    def _choose_model(self) -> bool:
        """At the first optimiser step: the top-level training module with the most parameters
        (the model, not a loss module called beside it); its hook replaces the global ones."""
        if not self._candidates:
            return False
        module, tally = max(self._candidates.values(), key=lambda c: _n_params(c[0]))
        self._candidates.clear()
        self._remove(self._handles[:2])
        self._handles[:2] = [module.register_forward_hook(self._on_forward, with_kwargs=True)]
        self.model, self.tally = module, tally
        self._fpt = flops_per_token(module)
        return True

    # ---- every step ---------------------------------------------------------------------
    def _on_forward(self, module, args, kwargs, output) -> None:
        if not self._ours() or not (module.training and self.torch.is_grad_enabled()):
            return
        try:
            count_forward(self.tally, args, kwargs, output)
        except Exception as e:  # noqa: BLE001
            self.switch_off(e)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not self._ours():
            return
        try:
            if self.model is None and not self._choose_model():
                return  # a step with no training forward before it: nothing was trained
            if self.tally.forwards:  # a second optimiser in the same iteration adds nothing
                self.run.step(**self.tally.take())
        except Exception as e:  # noqa: BLE001
            self.switch_off(e)

    # ---- Hugging Face generate() --------------------------------------------------------
    def wrap_generate(self, generate):
        """GenerationMixin.generate, recorded as one generation per call."""

        def recorded_generate(model, *args, **kwargs):
            if not self._ours():
                return generate(model, *args, **kwargs)
            started = time.perf_counter()
            output = generate(model, *args, **kwargs)
            try:
                prompt = kwargs.get("input_ids", args[0] if args else None)
                sequences = getattr(output, "sequences", output)
                if hasattr(prompt, "shape") and hasattr(sequences, "shape"):
                    new = (sequences.shape[-1] - prompt.shape[-1]) * sequences.shape[0]
                    self.ensure_run(model).generation(
                        prompt_tokens=prompt.numel(), new_tokens=new,
                        total_ms=(time.perf_counter() - started) * 1000.0)
            except Exception as e:  # noqa: BLE001
                self.switch_off(e)
            return output

        recorded_generate.__wrapped__ = generate
        recorded_generate.__doc__ = generate.__doc__
        return recorded_generate


def _n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _precision(torch, module) -> str:
    """The dtype the matmuls run in, for MFU's peak: autocast's, else the weights'."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return precision_of(torch.get_autocast_dtype(device))
    param = next(module.parameters(), None)
    return precision_of(param.dtype if param is not None else "fp32")
