"""The yardstick the zero-code hooks' cost is measured against (bench_autohook.py --vs-floor,
bench_realworld.py --floor): see floor_hooks."""

from __future__ import annotations

import time

RECORDS: list = []  # the floor's one record a step


def floor_hooks(autohook):
    """Hooks that do the least a step needs, as ours do it: take the global module hooks out for
    a top-level forward and put them back after it, keep the forward's ids' shape and the backward's
    loss, append one record a step (its times, that shape, the loss read). What any hooks in
    Python cost on this bench: ours are measured against them (--vs-floor)."""

    class FloorHooks(autohook.AutoInstrument):
        def _enter(self, module, args):
            nn, post_id = self._nn, self._post_id
            nn._global_forward_pre_hooks.pop(self._pre_id, None)
            nn._global_forward_hooks.pop(post_id, None)
            module._forward_hooks[post_id] = self._leave_hook
            module._forward_hooks_with_kwargs[post_id] = True
            module._forward_hooks_always_called[post_id] = True
            self._began = time.perf_counter()
            if self.run is None:
                self.ensure_run(module, args)

        def _leave(self, module, args, kwargs, output):
            post_id = self._post_id
            module._forward_hooks.pop(post_id, None)
            module._forward_hooks_with_kwargs.pop(post_id, None)
            module._forward_hooks_always_called.pop(post_id, None)
            nn = self._nn
            nn._global_forward_pre_hooks[self._pre_id] = self._enter_hook
            nn._global_forward_hooks[post_id] = self._leave_hook
            # the shape, not the tensor: the first argument may be a model's output (a loss
            # module's call), whose graph would then be freed inside a later hook
            self._shape = getattr(args[0], "shape", None) if args else None

        def _wrap_backward(self, backward):
            def recorded_backward(tensors, *args, **kwargs):
                # as ours: a CPU root read at once (one tensor op), another device's kept to read
                self._loss = tensors.item() if tensors.is_cpu else tensors.detach()
                return backward(tensors, *args, **kwargs)

            return recorded_backward

        def _before_optimizer_step(self, optimizer, args, kwargs):
            return None

        def _on_optimizer_step(self, optimizer, args, kwargs):
            RECORDS.append((time.perf_counter(), self._began, self._shape, float(self._loss)))

    return FloorHooks
