"""An unmodified Hugging Face Trainer script: a tiny GPT-2 from config on a learnable token set.

Prints the Trainer's own figures as one JSON line (GPUWATCH_TEST ...) for the test to compare.
Args: OUTPUT_DIR [--pad] pads the last 4 positions of every sequence (attention_mask 0 there);
[--callback] adds gpuwatch's Trainer callback (the explicit, one-line integration);
[--tensorboard] has the Trainer write its own TensorBoard logs (output_dir/runs/...);
[--loss-func] gives the Trainer its own loss (compute_loss_func: label-smoothed cross-entropy),
which the model's output does not hold; [--twice] calls train() twice (its figures: the second's);
[--loss-module] a Trainer whose compute_loss calls the model inside a loss module (as
sentence-transformers' losses do), after a no-grad pass of the model (TRL's KTO: its KL pass),
checkpointing every 4 steps; [--resume] resumes from the latest checkpoint in OUTPUT_DIR.
"""

import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

PAD = "--pad" in sys.argv
SEQ, BATCH, STEPS, ACCUM = 32, 4, 12, 2
torch.manual_seed(0)


class Counting(torch.utils.data.Dataset):
    def __len__(self):
        return BATCH * ACCUM * STEPS

    def __getitem__(self, i):
        ids = (torch.arange(SEQ) * (1 + i % 3) + i) % 64
        mask = torch.ones(SEQ, dtype=torch.long)
        if PAD:
            mask[-4:] = 0
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(
    output_dir=sys.argv[1],
    per_device_train_batch_size=BATCH,
    gradient_accumulation_steps=ACCUM,
    max_steps=STEPS,
    logging_steps=1,
    learning_rate=1e-3,
    save_strategy="steps" if "--loss-module" in sys.argv else "no",
    save_steps=4,
    report_to=["tensorboard"] if "--tensorboard" in sys.argv else [],
    use_cpu=True,
    dataloader_num_workers=0,
    disable_tqdm=True,
    include_num_input_tokens_seen="non_padding",
)


def smoothed(outputs, labels, num_items_in_batch=None):
    logits, targets = outputs.logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1)
    summed = torch.nn.functional.cross_entropy(logits, targets, label_smoothing=0.1, reduction="sum")
    return summed / (num_items_in_batch if num_items_in_batch is not None else (targets != -100).sum())


class LossModule(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs):
        return self.model(**inputs).loss


class LossModuleTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with torch.no_grad():
            model(**inputs)  # a reference pass, not evaluation
        return LossModule(model)(inputs)


callbacks = []
if "--callback" in sys.argv:
    from gpuwatch.integrations.hf import GpuwatchCallback

    callbacks.append(GpuwatchCallback(name="hf-explicit"))
trainer = (LossModuleTrainer if "--loss-module" in sys.argv else Trainer)(
    model=model,
    args=args,
    train_dataset=Counting(),
    callbacks=callbacks,
    compute_loss_func=smoothed if "--loss-func" in sys.argv else None,
)
result = trainer.train(resume_from_checkpoint="--resume" in sys.argv or None)
if "--twice" in sys.argv:
    result = trainer.train()
prompt = torch.tensor([[1, 2, 3, 4]])
generated = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
print(
    "GPUWATCH_TEST "
    + json.dumps(
        {
            "metrics": result.metrics,
            "logged": trainer.state.log_history,
            "generated": generated.shape[-1] - prompt.shape[-1],
            "callbacks": [type(c).__module__ for c in trainer.callback_handler.callbacks],
        }
    )
)
