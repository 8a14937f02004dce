"""What a training step consumed, read from the inputs and outputs of a model's forward.

Shared by the zero-code hooks and the framework callbacks. Counts never synchronise the GPU:
a masked token count stays a tensor until the step is resolved, as a loss does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from math import prod
from typing import Any

_TOKEN_KEYS = ("input_ids", "tokens", "idx")
_MASK_KEY = "attention_mask"
# Integer inputs that are not token ids: an image classifier's class labels (`pixel_values=`,
# `labels=`), wherever no key above holds the ids.
_LABEL_KEYS = frozenset(("labels", "label", "targets", "target"))


_INT_DTYPES: frozenset = frozenset()
IDS_TRUSTED_AFTER = 8  # forwards in a row of token ids, after which their dtype is not read


def _is_int_tensor(value) -> bool:
    """A tensor of token ids: integer dtype, at least one dimension. Set lookups only: this runs
    every forward, usually with cold caches."""
    global _INT_DTYPES
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    if not _INT_DTYPES:
        torch = sys.modules["torch"]  # a tensor exists, so torch is imported
        _INT_DTYPES = frozenset((torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8))
    return dtype in _INT_DTYPES and value.ndim >= 1


def find_tokens(args: tuple = (), kwargs: Mapping | None = None):
    """(token ids, attention mask or None) from a forward's arguments or a batch; (None, None)
    when no integer tensor is there, or when the first argument is a float tensor (images and
    their labels, a diffusion model's sample and timesteps). A batch may be a tensor, a mapping
    or a tuple/list."""
    if not kwargs:  # the usual model(ids): its first argument, else the others
        if args and _is_int_tensor(args[0]):
            return args[0], None
        kwargs = {}
    else:
        for key in _TOKEN_KEYS:
            if _is_int_tensor(kwargs.get(key)):
                return kwargs[key], kwargs.get(_MASK_KEY)
    if args and getattr(getattr(args[0], "dtype", None), "is_floating_point", False):
        return None, None
    others = [v for k, v in kwargs.items() if k not in _LABEL_KEYS] if kwargs else ()
    for value in (*args, *others):
        if _is_int_tensor(value):
            return value, kwargs.get(_MASK_KEY)
        if isinstance(value, Mapping):
            found = find_tokens((), value)
            if found[0] is not None:
                return found
        elif isinstance(value, (tuple, list)) and value and not isinstance(value[0], (int, float, str)):
            found = find_tokens(tuple(value))
            if found[0] is not None:
                return found
    return None, None


def packed(kwargs: Mapping | None):
    """(sequences, the longest or None) of a padding-free batch, several sequences flattened into
    one row, as Hugging Face's flash-attention arguments tell them apart (`cu_seq_lens_q`: where
    each one starts, `max_length_q`: the longest; TRL's padding-free and packing collators, and
    DataCollatorWithFlattening, pass them); None for any other batch."""
    if not kwargs or "cu_seq_lens_q" not in kwargs:
        return None
    shape = getattr(kwargs["cu_seq_lens_q"], "shape", None)
    if shape is None or len(shape) != 1 or shape[0] < 2:
        return None
    longest = kwargs.get("max_length_q")
    return shape[0] - 1, longest if type(longest) is int else None


def loss_of(output):
    """The loss a model returned: a `.loss` attribute, a "loss" key, or the first 0-dim float
    tensor of a returned tuple; else None."""
    if output is None:
        return None
    if hasattr(output, "dtype"):  # a bare tensor: the loss itself, or logits
        return output if is_scalar_float(output) else None
    if type(output) is tuple:  # (logits, loss), (output, hidden): before the costlier ABC check below
        for value in output:
            if is_scalar_float(value):
                return value
        return None
    # A Hugging Face ModelOutput's field, read as an attribute: its Mapping check and get() cost
    # 3-5 µs more every forward with the caches a forward left cold.
    loss = getattr(output, "loss", None)
    if is_scalar_float(loss):
        return loss
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif isinstance(output, (tuple, list)):
        loss = next((v for v in output if is_scalar_float(v)), None)
    return loss if is_scalar_float(loss) else None


def is_scalar_float(value) -> bool:
    """A 0-dim float tensor: a loss. (0-dim first: a model's usual output, its logits, is not; and it is one attribute.)"""
    return getattr(value, "ndim", None) == 0 and getattr(
        getattr(value, "dtype", None), "is_floating_point", False
    )


def sum_losses(losses: list):
    """The sum of a non-empty list of losses (tensors or floats), as it is in the list when alone:
    not sum(), whose int start costs a tensor op."""
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total


class StepTally:
    """Tokens, samples and losses of the micro-batches since the last optimiser step. A loss is
    the one the model returned or, when it returned none, the scalar the program called
    backward() on (a root)."""

    def __init__(self) -> None:
        self.reset()
        # The type of the token ids of the last IDS_TRUSTED_AFTER forwards in a row, each the
        # first argument (none by keyword) or `input_ids=`: from then on the dtype of a tensor of
        # that type there is not read (see count_forward).
        self.ids_type: type | None = None
        self.ids_in_row = 0
        self.loss_at = 0  # where the loss was in the last tuple a forward returned ((logits, loss))
        # (these three outlive a step: what the model's forwards are like, not what a step held)

    def ids_seen(self, ids) -> None:
        """A forward's first argument (none by keyword), or its `input_ids=`, held token ids."""
        self.ids_in_row += 1
        if self.ids_in_row == IDS_TRUSTED_AFTER:
            self.ids_type = type(ids)

    def no_ids(self) -> None:
        """A forward's first argument held floats: its dtype is read every forward again."""
        self.ids_in_row, self.ids_type = 0, None

    def reset(self) -> None:
        self.forwards = 0
        self.tokens: Any = None
        self.samples = 0
        self.seq_len: int | None = None
        self.losses: list = []  # the ones the model returned (see add_loss)
        self.roots: list = []  # the scalars backward() was called on (see add_root)
        self._summed = False

    def add(self, ids, mask=None, seq_first: bool = False, flattened=None) -> None:
        """One forward's (batch, seq_len) id tensor, or (seq_len, batch) with `seq_first`:
        tokens are the unmasked ones when a mask of the same shape is given (a tensor, summed on
        its device without waiting); `flattened`: packed()'s sequences in a padding-free row."""
        self.forwards += 1
        if ids is None:
            return
        shape = ids.shape
        if not shape:
            return  # a 0-dim integer: not token ids
        if len(shape) == 1:
            samples, seq_len = 1, shape[0]
        else:
            samples, seq_len = (shape[-1], shape[0]) if seq_first else (shape[0], shape[-1])
        if flattened is not None:  # (a padding-free row: its sequences, not its length, are the shape)
            samples, seq_len = flattened[0], flattened[1] or seq_len
        if mask is not None and getattr(mask, "shape", None) == shape:
            tokens = mask.sum()
        else:
            tokens = prod(shape)  # ids.numel(), without another tensor attribute read: every forward
        if self.tokens is None:  # the step's first forward with token ids
            self.tokens, self.samples, self.seq_len = tokens, samples, seq_len
            return
        self.tokens += tokens
        self.samples += samples
        if seq_len > self.seq_len:
            self.seq_len = seq_len

    def add_loss(self, loss, normalised_over_step: bool = False) -> None:
        """normalised_over_step: the model already divided its loss by the whole step's item count
        (Hugging Face passes `num_items_in_batch`), so the step's loss is the sum, not the mean."""
        if loss is not None:
            # Its value now, not its storage: the program may change it in place before its
            # backward (timm's `loss /= accum_steps`), and the step's loss is the one returned. On
            # the CPU a read (no wait: the step reads it anyway); elsewhere a copy, read later.
            self.losses.append(loss.item() if loss.is_cpu else loss.detach().clone())
            self._summed = normalised_over_step

    def add_root(self, loss) -> None:
        """A scalar the program called backward() on, after a forward of the model (detached)."""
        self.roots.append(loss)

    def forget_roots(self) -> None:
        self.roots.clear()

    def take_args(self) -> tuple:
        """(tokens, samples, seq_len, loss): the step's first arguments of Run.step() in order
        (positional: unpacking a dict into keywords costs more than the rest of a step's
        bookkeeping), and a fresh tally for the next step. The loss is the mean of the
        micro-batches' (a float on the CPU; elsewhere a tensor, read later without a sync); roots
        are summed: a loop that divides by its accumulation count before backward() (nanoGPT,
        accelerate) gets the mean micro-batch loss."""
        losses = self.losses or self.roots
        if len(losses) < 2:
            loss = losses[0] if losses else None  # (not summed, not divided by 1: a tensor op each)
        else:
            loss = sum_losses(losses)
            if self.losses and not self._summed:
                loss = loss / len(losses)
        fields = self.tokens, self.samples or None, self.seq_len, loss
        # reset(), inlined: a call costs a µs or more with the caches a training step left cold
        self.forwards, self.tokens, self.samples, self.seq_len = 0, None, 0, None
        self.losses, self.roots, self._summed = [], [], False
        return fields

    def take(self) -> dict:
        """The step's fields for Run.step(), and a fresh tally for the next step."""
        tokens, samples, seq_len, loss = self.take_args()
        return {"tokens": tokens, "samples": samples, "seq_len": seq_len, "loss": loss}


def count_forward(tally: StepTally, args, kwargs, output, seq_first: bool = False):
    """Add one training forward of the model: its token inputs and the loss it returned (which
    this returns, None when it returned none)."""
    # The usual model(ids) (or model(ids, targets)) returning logits, every forward: find_tokens'
    # and loss_of's first cases, inlined (a call of ours costs about a µs with the caches a forward
    # left cold).
    ids = args[0] if args and not kwargs else None
    if type(ids) is tally.ids_type:
        # A model fed token ids forward after forward: its input's dtype, a read that costs as
        # much as the rest of the count with the caches a forward left cold, is known.
        tally.add(ids, None, seq_first)
        if getattr(output, "ndim", 0):
            return None
    else:
        dtype = getattr(ids, "dtype", None)
        if dtype in _INT_DTYPES:
            tally.ids_seen(ids)
            tally.add(ids, None, seq_first)
            if getattr(output, "ndim", 0):
                return None
        elif dtype is not None and _INT_DTYPES:
            # model(x) of floats (images, an agent's state), model(images, labels) (timm's task),
            # model(x, timesteps): no token ids
            if tally.ids_in_row:  # (a call only when there is a run of ids to end: every forward here)
                tally.no_ids()
            tally.add(None)
            if getattr(output, "ndim", 0):
                return None
        elif kwargs and type(kwargs.get("input_ids")) is tally.ids_type:  # model(**batch), trusted as above
            tally.add(kwargs["input_ids"], kwargs.get(_MASK_KEY), seq_first, packed(kwargs))
        else:
            ids, mask = find_tokens(args, kwargs)
            if ids is not None and kwargs and ids is kwargs.get("input_ids"):
                tally.ids_seen(ids)
            tally.add(ids, mask, seq_first, packed(kwargs))
    if type(output) is tuple:
        # (logits, loss) every forward: the loss is looked for where it was, not behind the
        # logits (a read of another tensor, with the caches a forward left cold)
        at = tally.loss_at
        loss = output[at] if at < len(output) else None
        if not is_scalar_float(loss):
            loss = loss_of(output)
            tally.loss_at = next((i for i, value in enumerate(output) if value is loss), 0)
    else:
        loss = loss_of(output)
    if loss is not None:
        # Hugging Face passes num_items_in_batch when the model divides by the whole step's count.
        tally.add_loss(loss, normalised_over_step=kwargs.get("num_items_in_batch") is not None)
    return loss


def sequence_first(model) -> bool:
    """Whether the model takes (seq_len, batch) inputs: it holds modules with a `batch_first`
    flag (nn.Transformer*, nn.MultiheadAttention, nn.LSTM/GRU/RNN) and every one says False."""
    flags = [m.batch_first for m in model.modules() if isinstance(getattr(m, "batch_first", None), bool)]
    return bool(flags) and not any(flags)


_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "nhead")
# Hugging Face's attention implementations, as the OOM advice names them ("naive": B·H·L² scores).
_ATTN = {
    "eager": "naive",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flex_attention": "flex",
}


def model_shape(model, ids=None, mask=None, flattened=None) -> dict:
    """batch, seq_len, heads and attention implementation of a model's forward, from its inputs
    and config (Hugging Face's `num_attention_heads`, `_attn_implementation`) or its attention
    modules (nn.MultiheadAttention's num_heads): what an OOM postmortem's advice needs."""
    shape: dict = {}
    if ids is not None:
        tally = StepTally()
        tally.add(ids, None, sequence_first(model), flattened)
        shape["batch"], shape["seq_len"] = tally.samples, tally.seq_len
    config = getattr(model, "config", None)
    heads = next((getattr(config, k) for k in _HEADS if isinstance(getattr(config, k, None), int)), None)
    if heads is None:
        heads = next(
            (m.num_heads for m in model.modules() if isinstance(getattr(m, "num_heads", None), int)), None
        )
    if heads:
        shape["heads"] = heads
    attn = _ATTN.get(str(getattr(config, "_attn_implementation", None)))
    if attn:
        shape["attn"] = attn
    return shape


def trained_params(optimizers: Iterable, model=None) -> int:
    """The parameters the optimisers train, each once, leaving out the frozen ones an optimiser
    was given with the rest (AdamW over all of a LoRA model's: its adapters alone train); with
    no optimiser yet, the model's that require grad. What the OOM advice weighs as parameters,
    gradients and optimiser state."""
    trained = {id(p): p for opt in optimizers for group in opt.param_groups for p in group["params"]}
    params = trained.values() if trained else (model.parameters() if model is not None else ())
    return sum(p.numel() for p in params if p.requires_grad)


def precision_of(text) -> str:
    """'bf16-mixed', 'bf16', 'torch.bfloat16', '16-mixed', '32-true' … -> bf16 / fp16 / fp32."""
    text = str(text).lower()
    if "bf16" in text or "bfloat16" in text:
        return "bf16"
    if "16" in text:
        return "fp16"
    return "fp32"


def plain_config(obj) -> dict | None:
    """A model's or trainer's config as a plain dict (HF `to_dict()`, a dataclass, a Namespace,
    Lightning's hparams); None when it has none."""
    import dataclasses

    if obj is None:
        return None
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        try:
            obj = to_dict()
        except Exception:  # a config whose to_dict fails is not worth failing the run over
            return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if not isinstance(obj, Mapping):
        obj = getattr(obj, "__dict__", None)
    if not isinstance(obj, Mapping):
        return None
    return {str(k): v for k, v in obj.items() if not str(k).startswith("_")}


_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_WIDTH = ("hidden_size", "n_embd", "d_model", "dim")


def flops_per_token(model, config: Mapping | None = None):
    """FLOPs per training token as a function of seq_len: 6·N from the parameter count, plus
    PaLM's attention term 12·L·d·T when the model's config names its layers and width."""
    from gpuwatch.client.flops import transformer_flops_per_token

    n_params = sum(p.numel() for p in model.parameters())
    config = config or plain_config(getattr(model, "config", None)) or {}
    layers = next((config[k] for k in _LAYERS if isinstance(config.get(k), int)), None)
    width = next((config[k] for k in _WIDTH if isinstance(config.get(k), int)), None)
    if not layers or not width:
        return lambda seq_len: 6.0 * n_params
    vocab = config.get("vocab_size") if isinstance(config.get("vocab_size"), int) else 1  # N is given
    return lambda seq_len: transformer_flops_per_token(
        layers, width, seq_len, vocab, n_params=n_params, training=True
    )
