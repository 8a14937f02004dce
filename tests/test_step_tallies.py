"""The zero-code hooks' per-step tallies start each step afresh: take_args() and StepSplit.take()
reset their state in place (a call to reset() or restart() costs a µs on a training step's cold
caches), so they must leave exactly what a new tally holds."""

from __future__ import annotations

import pytest

from gpuwatch.integrations.accounting import StepTally
from gpuwatch.integrations.iteration import StepSplit, name_optimizers

torch = pytest.importorskip("torch")


def test_taking_a_steps_tally_leaves_a_fresh_one():
    tally = StepTally()
    ids = torch.ones(4, 16, dtype=torch.long)
    tally.add(ids)
    tally.add(ids)
    tally.add_loss(torch.tensor(2.0), normalised_over_step=True)
    tally.add_root(torch.tensor(1.0))
    tokens, samples, seq_len, loss = tally.take_args()
    assert (tokens, samples, seq_len, float(loss)) == (128, 8, 16, 2.0)
    assert vars(tally) == vars(StepTally())


def test_taking_a_steps_split_leaves_a_fresh_interval_from_that_moment():
    now = [0.0]

    def clock() -> float:
        return now[0]

    split = StepSplit(clock=clock)
    split.loader(0.25)
    now[0] = 0.5
    assert split.aside_begin()
    now[0] = 1.0
    split.aside_end()
    split.compute_began()
    now[0] = 2.0
    reading = split.take()
    assert reading.fields() == {"data_wait_pct": 12.5, "eval_pct": 25.0, "compute_pct": 50.0}
    fresh = StepSplit(clock=clock)
    fresh.loader_seen = True  # a loader seen once stays seen
    assert vars(split) == vars(fresh)


def test_with_no_data_loader_the_data_wait_is_the_time_before_compute_less_evaluations():
    """A loop that builds its own batches: what came before its first training forward, but an
    evaluation or a checkpoint between steps, is the batch's making."""
    now = [0.0]
    split = StepSplit(clock=lambda: now[0])
    now[0] = 0.25
    assert split.aside_begin()  # an evaluation, then a checkpoint: 0.25 s … 0.75 s
    now[0] = 0.75
    split.aside_end()
    now[0] = 1.0
    split.compute_began()
    now[0] = 2.0
    assert split.take().fields() == {"data_wait_pct": 25.0, "eval_pct": 25.0, "compute_pct": 50.0}
    now[0] = 3.0
    assert split.take().fields() == {"eval_pct": 0.0}  # no training forward: nothing known


def test_class_labels_and_timesteps_beside_a_float_input_are_not_token_ids():
    from gpuwatch.integrations.accounting import find_tokens

    images, labels, ids = torch.randn(8, 3, 4, 4), torch.randint(0, 4, (8,)), torch.randint(0, 9, (2, 5))
    assert find_tokens((images, labels)) == (None, None)  # timm's task(input, target)
    assert find_tokens((images, torch.randint(0, 1000, (8,))), {"context": None}) == (None, None)
    assert find_tokens((), {"pixel_values": images, "labels": labels}) == (None, None)
    assert find_tokens(({"pixel_values": images, "labels": labels},)) == (None, None)  # a batch
    assert find_tokens((ids, labels))[0] is ids  # model(ids, targets)
    assert find_tokens((), {"input_ids": ids, "labels": ids})[0] is ids
    assert find_tokens((), {"decoder_input_ids": ids, "labels": ids})[0] is ids


def test_token_ids_stay_counted_once_their_dtype_is_known_and_floats_never_count():
    """After IDS_TRUSTED_AFTER forwards of token ids in a row, their dtype is not read again: each
    later step's count is still its own ids' (lengths change); a model fed floats (an agent's
    state) never gets there and counts no tokens."""
    from gpuwatch.integrations.accounting import IDS_TRUSTED_AFTER, count_forward

    tally, logits = StepTally(), torch.zeros(1, 1, 3)
    lengths = [16] * IDS_TRUSTED_AFTER + [32, 8, 100]
    for length in lengths:
        count_forward(tally, (torch.ones(2, length, dtype=torch.long),), {}, logits)
        assert tally.take_args()[:3] == (2 * length, 2, length)
    assert tally.ids_type is torch.Tensor  # (the steps after the eighth took the known-dtype path)
    states = StepTally()
    for _ in lengths:
        count_forward(states, (torch.randn(2, 16),), {}, logits)
        assert states.take_args()[:3] == (None, None, None)
    assert states.ids_type is None
    # ids after floats: counted, and from the eighth in a row on, trusted
    for length in lengths:
        count_forward(states, (torch.ones(2, length, dtype=torch.long),), {}, logits)
        assert states.take_args()[:3] == (2 * length, 2, length)
    assert states.ids_type is torch.Tensor
    # model(**batch): input_ids= and its attention mask (unmasked tokens), before and after trust
    batches = StepTally()
    for length in lengths:
        ids, mask = torch.ones(2, length, dtype=torch.long), torch.ones(2, length, dtype=torch.long)
        mask[1, length // 2 :] = 0
        count_forward(batches, (), {"input_ids": ids, "attention_mask": mask, "labels": ids}, logits)
        tokens, samples, seq_len, _ = batches.take_args()
        assert (int(tokens), samples, seq_len) == (length + length // 2, 2, length)
    assert batches.ids_type is torch.Tensor


def test_the_loss_a_tuple_returns_is_found_wherever_it_moves():
    """(logits, loss) forward after forward, then a model returning (loss, logits), then none:
    each forward's own loss, never the logits nor a stale place's."""
    from gpuwatch.integrations.accounting import count_forward

    tally, ids, logits = StepTally(), torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 4, 9)
    for value in (1.0, 2.0, 3.0):
        assert float(count_forward(tally, (ids,), {}, (logits, torch.tensor(value)))) == value
    assert float(count_forward(tally, (ids,), {}, (torch.tensor(4.0), logits))) == 4.0
    assert float(count_forward(tally, (ids,), {}, (torch.tensor(5.0), logits))) == 5.0
    assert count_forward(tally, (ids,), {}, (logits,)) is None
    assert float(count_forward(tally, (ids,), {}, (logits, logits, torch.tensor(6.0)))) == 6.0
    assert tally.take_args()[3] == 3.5  # the step's: the mean of the six returned


def test_a_padding_free_row_is_its_sequences_the_longest_of_them_and_all_their_tokens():
    """TRL's padding-free and packing collators flatten a batch into one row, with Hugging Face's
    flash-attention arguments saying where each sequence starts: 3 sequences of 5, 9 and 7 are
    3 samples of at most 9 (what the OOM advice's B·H·L² weighs), not one of 21."""
    from gpuwatch.integrations.accounting import count_forward, model_shape, packed

    row = torch.randint(0, 64, (1, 21))
    positions = torch.cat([torch.arange(n) for n in (5, 9, 7)])[None]
    kwargs = {
        "input_ids": row,
        "position_ids": positions,
        "cu_seq_lens_q": torch.tensor([0, 5, 14, 21]),
        "max_length_q": 9,
    }
    tally = StepTally()
    count_forward(tally, (), kwargs, torch.zeros(1, 21, 64))
    assert tally.take_args()[:3] == (21, 3, 9)
    assert model_shape(torch.nn.Linear(2, 2), row, None, packed(kwargs)) == {"batch": 3, "seq_len": 9}
    count_forward(tally, (), {"input_ids": row, "position_ids": positions}, torch.zeros(1, 21, 64))
    assert tally.take_args()[:3] == (21, 1, 21)  # (no starts given: one row of 21)


def test_optimisers_held_by_the_programs_modules_are_named_after_where_they_are_held():
    """stable-baselines3 keeps each optimiser on the module it trains (`self.actor.optimizer`)
    and calls those modules through methods of its own, so no module name is known: the name is
    the path from the program's `self`, not opt0, opt1."""
    torch = pytest.importorskip("torch")

    class Algorithm:
        def __init__(self):
            self.actor, self.critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
            self.actor.optimizer = torch.optim.Adam(self.actor.parameters())
            self.critic.optimizer = torch.optim.Adam(self.critic.parameters())
            self.ent_coef_optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)])

        def train(self):
            optimizers = [self.ent_coef_optimizer, self.critic.optimizer, self.actor.optimizer]
            return name_optimizers(optimizers, lambda opt: None)

    assert list(Algorithm().train().values()) == ["ent_coef_optimizer", "critic.optimizer", "actor.optimizer"]
