"""Unmodified: torch reached the ways libraries reach it. Arg: find_spec | import_module |
transformers | spawn (the training runs in a multiprocessing `spawn` child)."""

import sys

HOW = sys.argv[1]
if HOW == "find_spec":  # what transformers, datasets and evaluate do before importing torch
    import importlib.util

    assert importlib.util.find_spec("torch") is not None
    import torch
elif HOW == "import_module":
    import importlib

    torch = importlib.import_module("torch")
elif HOW == "transformers":
    import torch
    import transformers  # noqa: F401 — imports torch lazily, after its own find_spec
else:
    import multiprocessing

    import torch


def train(steps=3):
    from tiny_model import TinyLM, V

    model = TinyLM()
    for _ in range(steps):  # updated by hand (torch.optim's first use imports dynamo: ~1 s a run)
        x = torch.randint(0, V, (2, 8))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad


if __name__ == "__main__":
    if HOW == "spawn":
        child = multiprocessing.get_context("spawn").Process(target=train)
        child.start()
        child.join()
        sys.exit(child.exitcode)
    train()
    print("done")
