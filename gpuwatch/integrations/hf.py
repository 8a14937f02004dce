"""Hugging Face: `Trainer(..., callbacks=[GpuwatchCallback()])` records training as a gpuwatch run.

Hugging Face callbacks do not see the batches, so the callback hooks the model's forward (one
hook, on the outermost model) for tokens and the loss, and steps at the Trainer's optimiser
steps; the config is the TrainingArguments and the model's config. Under `gpuwatch run` the
bootstrap adds this callback to every Trainer (`add_to_trainers`), which also gives it the loss
the Trainer trains on (see watch); the zero-code hooks then stand aside and count the forwards
for it, so no hook is put on the model.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

from gpuwatch.client.run import start_run
from gpuwatch.integrations import autohook
from gpuwatch.integrations.accounting import (
    StepTally,
    count_forward,
    find_tokens,
    flops_per_token,
    model_shape,
    packed,
    plain_config,
    sum_losses,
    trained_params,
)


class GpuwatchCallback(TrainerCallback):
    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.run = None
        self._tally = StepTally()
        self._hook = None
        self._first = None  # a pre-hook of the first forward: its shape, before an OOM in it
        self._trained: list = []  # the step's training_step() results, once watching a Trainer

    def watch(self, trainer) -> None:
        """Take each step's loss from what `trainer.training_step` returns, summed over the step's
        micro-batches (the loss the Trainer trains on and logs), not from the model's output:
        TRL's SFT (its own normalisation) and DPO losses, a `compute_loss_func`, a subclass's
        `compute_loss`. Wraps the method on this Trainer alone, the most derived one."""
        training_step = trainer.training_step

        def watched_training_step(*args, **kwargs):
            loss = training_step(*args, **kwargs)
            self._trained.append(loss)
            return loss

        watched_training_step.__wrapped__ = training_step
        trainer.training_step = watched_training_step
        save = getattr(trainer, "_save_checkpoint", None)
        if save is not None:
            trainer._save_checkpoint = _timed_as_checkpoint(save)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.run is not None:
            return
        config = {
            "training_args": plain_config(args),
            "model": plain_config(getattr(model, "config", None)),
            "n_params": trained_params([optimizer] if optimizer is not None else [], model),
        }
        self.run = start_run(
            name=self.name or args.run_name,
            config=config,
            flops_per_token=flops_per_token(model),
            precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            steps_before=state.global_step,  # (resumed from a checkpoint: numbered as its log)
        )
        hooks = autohook.active()
        if hooks is not None:
            hooks.stand_aside(model, self._tally, self.run)  # (which tells the run the first forward's shape)
        else:
            self._hook = model.register_forward_hook(self._on_forward, with_kwargs=True)
            self._first = model.register_forward_pre_hook(self._on_first_forward, with_kwargs=True)

    def _on_first_forward(self, module, args, kwargs) -> None:
        self._first.remove()
        self._first = None
        if self.run is not None:
            self.run.note_shape(**model_shape(module, *find_tokens(args, kwargs), packed(kwargs)))

    def _on_forward(self, module, args, kwargs, output) -> None:
        if module.training and torch.is_grad_enabled():
            count_forward(self._tally, args, kwargs, output)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.run is not None:  # the batch is in hand: the time since the last step was data wait
            self.run.mark_compute()
            hooks = autohook.active()
            if hooks is not None:  # what the step does from here is compute, a no-grad pass too
                hooks.split.compute_began()  # (KTO's KL pass, GRPO's rollouts: not evaluation)

    def on_step_end(self, args, state, control, **kwargs):
        if self.run is not None:
            hooks = autohook.active()  # where the hooks time the step: the data loader, evaluation
            fields = self._tally.take()
            if self._trained:
                fields["loss"], self._trained = sum_losses(self._trained), []
            self.run.step(**fields, split=hooks.split.take() if hooks is not None else None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None:
            if self._hook is not None:
                for hook in (self._hook, self._first):
                    if hook is not None:
                        hook.remove()
                self._hook = self._first = None
            elif autohook.active() is not None:
                autohook.active().stand_aside()
            self.run.finish()
            self.run = None


def _timed_as_checkpoint(save):
    """The Trainer's checkpoint (its weights through safetensors, not torch.save; the optimiser's
    state), timed as the step's checkpoint time when the zero-code hooks split the steps."""

    def timed_save(*args, **kwargs):
        hooks = autohook.active()
        if hooks is None or not hooks.split.aside_begin():
            return save(*args, **kwargs)
        try:
            return save(*args, **kwargs)
        finally:
            hooks.split.aside_end()

    timed_save.__wrapped__ = save
    return timed_save


def add_to_trainers(trainer_module) -> None:
    """Every Trainer built from now on gets a GpuwatchCallback, unless it was given one."""
    trainer_class = trainer_module.Trainer
    init = trainer_class.__init__

    def init_with_gpuwatch(trainer, *args, **kwargs):
        init(trainer, *args, **kwargs)
        ours = [c for c in trainer.callback_handler.callbacks if isinstance(c, GpuwatchCallback)]
        if not ours:
            ours.append(GpuwatchCallback())
            trainer.add_callback(ours[0])
        ours[0].watch(trainer)

    init_with_gpuwatch.__wrapped__ = init
    trainer_class.__init__ = init_with_gpuwatch
