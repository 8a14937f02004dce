"""Unmodified: generate() with a tiny encoder-decoder model (T5 from config): its output is the
decoder's sequence (a start token, then 4 new tokens a row), shorter than its 12-token prompts,
the second of which is padded by 3. Prints the output's shape."""

import torch
from transformers import T5Config, T5ForConditionalGeneration

torch.manual_seed(0)
config = T5Config(
    vocab_size=32,
    d_model=16,
    d_ff=32,
    d_kv=8,
    num_layers=1,
    num_heads=2,
    decoder_start_token_id=0,
    pad_token_id=0,
)
model = T5ForConditionalGeneration(config).eval()
prompt = torch.randint(2, 32, (2, 12))
mask = torch.ones_like(prompt)
mask[1, -3:] = 0
out = model.generate(
    prompt, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, eos_token_id=1
)
print("generated", tuple(out.shape))
