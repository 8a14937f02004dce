"""Unmodified: a Hugging Face GPT-2 built from its config with eager attention, trained in a
plain loop at L=8192, batch 8, 8 heads: the eager B·H·L² scores (16 GiB in fp32) cannot fit."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

B, L = 8, 8192
config = GPT2Config(vocab_size=64, n_positions=L, n_embd=64, n_layer=1, n_head=8)
model = GPT2LMHeadModel._from_config(config, attn_implementation="eager")
opt = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 64, (B, L))
model(input_ids=ids, labels=ids).loss.backward()
opt.step()
