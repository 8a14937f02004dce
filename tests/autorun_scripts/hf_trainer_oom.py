"""Unmodified: a Hugging Face Trainer training GPT-2 with eager attention at L=8192, batch 8,
8 heads: the first forward's B·H·L² scores (16 GiB in fp32) cannot fit. Arg: OUTPUT_DIR."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

B, L = 8, 8192


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return B * 2

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (L,))
        return {"input_ids": ids, "labels": ids}


config = GPT2Config(vocab_size=64, n_positions=L, n_embd=64, n_layer=1, n_head=8)
model = GPT2LMHeadModel._from_config(config, attn_implementation="eager")
args = TrainingArguments(
    output_dir=sys.argv[1],
    per_device_train_batch_size=B,
    max_steps=2,
    report_to=[],
    save_strategy="no",
    use_cpu=True,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
