"""Lightning: `Trainer(..., callbacks=[GpuwatchCallback()])` records the fit as a gpuwatch run.

Steps are Lightning's optimiser steps (gradient accumulation counted once), tokens come from the
batches, the loss is what training_step returned, the config is the module's hyperparameters.
A validation loop run between two steps is the next step's evaluation time (its eval_pct).
Under `gpuwatch run` the bootstrap adds this callback to every Trainer (`add_to_trainers`) and
the zero-code hooks stand aside while it records the fit (Fabric loops go through the hooks);
under manual optimisation (a GAN's two optimisers, stepped by training_step itself) the hooks
make this run's steps instead, as in a plain loop: each optimiser's loss from its backward().
"""

from __future__ import annotations

import lightning.pytorch as pl

from gpuwatch.client.run import start_run
from gpuwatch.integrations import autohook
from gpuwatch.integrations.accounting import (
    StepTally,
    find_tokens,
    flops_per_token,
    model_shape,
    plain_config,
    precision_of,
    trained_params,
)
from gpuwatch.integrations.iteration import StepSplit


class GpuwatchCallback(pl.Callback):
    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.run = None
        self._tally = StepTally()
        self._global_step = 0
        self._shaped = False  # the first batch's shape went to the run (for an OOM postmortem)
        self._own_split = StepSplit()  # where a step's time went, with no zero-code hooks to say
        self._hooks_step = False  # manual optimisation under `gpuwatch run`: the hooks make the steps

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        config = dict(
            plain_config(pl_module.hparams) or {},
            max_steps=trainer.max_steps,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            precision=str(trainer.precision),
            world_size=trainer.world_size,
            n_params=trained_params(trainer.optimizers, pl_module),
        )
        self.run = start_run(
            name=self.name,
            config=config,
            flops_per_token=flops_per_token(pl_module),
            precision=precision_of(trainer.precision),
            # resumed from a checkpoint: numbered as its log (stepping by hand, a GAN's global
            # step counts each optimiser's steps)
            steps_before=trainer.global_step if pl_module.automatic_optimization else 0,
        )
        self._global_step = trainer.global_step
        hooks = autohook.active()
        self._hooks_step = hooks is not None and not pl_module.automatic_optimization
        if self._hooks_step:
            hooks.adopt(self.run)
        elif hooks is not None:
            hooks.stand_aside(pl_module)
        self._split().restart()  # the first step is timed from here, as the run times it

    def _split(self) -> StepSplit:
        """The hooks' split under `gpuwatch run` (they also time the data loader), else our own."""
        hooks = autohook.active()
        return hooks.split if hooks is not None else self._own_split

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.run is None:
            return
        self.run.mark_compute()  # the batch is loaded: the time since the last step was data wait
        self._split().compute_began()
        if not self._shaped:  # before the first forward: an OOM in it gets the full advice
            self._shaped = True
            self.run.note_shape(
                **model_shape(pl_module, find_tokens((batch,))[0]), precision=precision_of(trainer.precision)
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.run is None or self._hooks_step:
            return
        ids, mask = find_tokens((batch,))
        self._tally.add(ids, mask)
        # Lightning divides the returned loss by accumulate_grad_batches, in an epoch's shorter last
        # window too: undone, the step's loss is the mean of its micro-batches'.
        loss, n = (
            outputs.get("loss") if isinstance(outputs, dict) else outputs,
            trainer.accumulate_grad_batches,
        )
        self._tally.add_loss(loss * n if loss is not None and n > 1 else loss)
        if trainer.global_step != self._global_step:  # an optimiser step ended this batch
            self._global_step = trainer.global_step
            self.run.step(**self._tally.take(), split=self._split().take())

    # Lightning runs validation inside fit, after a step's batch: the next step's evaluation time
    # (unless the step's compute began already: mid-accumulation, it is that compute's).
    def on_validation_start(self, trainer, pl_module) -> None:
        if self.run is not None and not trainer.sanity_checking:
            self._split().aside_begin()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.run is not None and not trainer.sanity_checking:
            self._split().aside_end()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._stop_standing_aside()
            self.run.finish()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.run is not None:
            self._stop_standing_aside()
            self.run.end_from_exception(exception)

    def _stop_standing_aside(self) -> None:
        hooks = autohook.active()
        if hooks is not None and self._hooks_step:
            hooks.adopt(None)
        elif hooks is not None:
            hooks.stand_aside()


def add_to_trainers(trainer_module) -> None:
    """Every Trainer built from now on gets a GpuwatchCallback, unless it was given one."""
    trainer_class = trainer_module.Trainer
    init = trainer_class.__init__

    def init_with_gpuwatch(trainer, *args, **kwargs):
        init(trainer, *args, **kwargs)
        if not any(isinstance(c, GpuwatchCallback) for c in trainer.callbacks):
            trainer.callbacks.append(GpuwatchCallback())

    init_with_gpuwatch.__wrapped__ = init
    trainer_class.__init__ = init_with_gpuwatch
