"""Unmodified third-party training code under `gpuwatch run`, against a plain run in the same sitting.

Nothing third-party is committed: pass the checkouts you have (each row runs when its path is
given). Every script gets tiny sizes on the CPU and local data only (no downloads):

  --nanogpt DIR            karpathy/nanoGPT (train.py, shakespeare_char config, compile off and on;
                           its prepare.py runs on a generated text file)
  --hf-examples DIR        a folder with Hugging Face's examples/pytorch/language-modeling/
                           run_clm.py (the Trainer) and/or run_clm_no_trainer.py (accelerate, no
                           Trainer); a tiny GPT-2 config and a word-level tokenizer are made
                           locally (needs `datasets` and `evaluate`)
  --pytorch-examples DIR   pytorch/examples (word_language_model/main.py: parameters updated by
                           hand with p.data.add_, whole-model torch.save; wikitext-2 trimmed;
                           dcgan/main.py --dataset fake: two models, two optimisers, D then G;
                           time_sequence_prediction/train.py: LBFGS, step(closure) evaluating the
                           closure up to 20 times, on generate_sine_wave.py's waves, shortened; where
                           torchvision or matplotlib is missing, bench/realworld_shims stands in)
  --lightning-examples DIR Lightning-AI/pytorch-lightning's examples/ (pytorch/basics/transformer.py:
                           the Trainer, loss computed in training_step, lightning.pytorch.demos'
                           Transformer on a generated data/wikitext-2.txt, so it downloads nothing;
                           its Trainer is shortened through Lightning's PL_TRAINER_* variables)
  always                   ours, in bench/realworld/: ema_whole_model.py (EMA by deepcopy,
                           whole-model checkpoints), lightning_loss_in_step.py (loss in
                           training_step), accelerate_loop.py (accelerate, no Trainer)

For each: steps recorded / steps done (the script's own log), tokens per step recorded vs the
true count, the largest loss difference vs the script's own log, median step time (the
script's own figure) and wall time under gpuwatch over plain, torch.compile recompilations
(TORCH_LOGS=recompiles) with and without, exit status with and without, and whether the files
the script wrote are byte-equal. With --floor, also the share of the floor's hooks
(bench/floor_hooks.py: the least any hooks that see a step cost) in ours' place, in the same sitting. OMP_NUM_THREADS=1 for both runs: on a shared machine torch's
default thread pool makes timings meaningless (see bench_contention.py).

    .venv/bin/python bench/bench_realworld.py --nanogpt /tmp/nanoGPT --pytorch-examples /tmp/examples
    .venv/bin/python bench/bench_realworld.py --hf-examples /tmp/hf --only no_trainer  # one row
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GPUWATCH = str(Path(PY).with_name("gpuwatch"))
OURS = ROOT / "bench" / "realworld"
STEP_LOSS = re.compile(r"^step (\d+) loss ([\d.]+) time ([\d.]+)ms", re.M)


@dataclass
class Row:
    name: str
    cmd: list[str]
    cwd: Path
    tokens_per_step: int | list[int]  # the true count: one for every step, or step by step
    parse: object  # (stdout) -> (steps done, {step: loss}, [step ms])
    outputs: list[str] = field(default_factory=list)  # files (relative to cwd) to compare
    env: dict = field(default_factory=dict)
    scratch: list[str] = field(default_factory=list)  # folders removed after each run (Lightning
    # numbers its log folders: the next run must write version_0 again)
    per_step: object = None  # (stdout) -> {step: {optimiser name or "closure_evals": value}}


def _ours_parse(out: str):
    found = STEP_LOSS.findall(out)
    return len(found), {int(s): float(loss) for s, loss, _ in found}, [float(ms) for *_, ms in found]


# ---- nanoGPT ---------------------------------------------------------------------------------


def nanogpt_rows(checkout: Path, work: Path) -> list[Row]:
    tree = work / "nanoGPT"
    shutil.copytree(checkout, tree, ignore=shutil.ignore_patterns(".git"))
    data = tree / "data" / "shakespeare_char"
    lines = [
        f"{who}: {' '.join(words)}\n"
        for who, words in (
            (f"CITIZEN {i % 7}", ["first", "second", "we", "are", "accounted", "poor"][i % 6 :] * 3)
            for i in range(4000)
        )
    ]
    (data / "input.txt").write_text("".join(lines))
    subprocess.run([PY, "prepare.py"], cwd=data, check=True, capture_output=True)
    iters, batch, block = 20, 4, 32
    base = [
        PY,
        "train.py",
        "config/train_shakespeare_char.py",
        "--device=cpu",
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        "--eval_interval=1000",
        "--eval_iters=2",
        "--log_interval=1",
        f"--batch_size={batch}",
        f"--block_size={block}",
        "--n_layer=2",
        "--n_head=2",
        "--n_embd=32",
        "--dropout=0.0",
        "--warmup_iters=2",
    ]

    def parse(out: str):
        found = re.findall(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms", out, re.M)
        # nanoGPT counts from iter 0; our steps from 1
        return (
            len(found),
            {int(i) + 1: float(loss) for i, loss, _ in found},
            [float(ms) for *_, ms in found[1:]],
        )

    return [
        Row(
            f"nanoGPT, compile {c}",
            [*base, f"--compile={c}"],
            tree,
            batch * block,
            parse,
            env={"TORCH_LOGS": "recompiles"},
        )
        for c in ("False", "True")
    ]


# ---- Hugging Face examples -------------------------------------------------------------------


def _tiny_hf_model(work: Path) -> tuple[Path, Path, Path]:
    """A GPT-2 config and a word-level tokenizer trained on generated text, saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    words = ["the", "model", "learns", "to", "count", "tokens", "on", "a", "shared", "server"]
    text = [" ".join(words[(i * j) % len(words)] for j in range(12)) for i in range(600)]
    train, valid = work / "train.txt", work / "valid.txt"
    train.write_text("\n".join(text[:500]) + "\n")
    valid.write_text("\n".join(text[500:]) + "\n")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(train)], trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"]))
    model_dir = work / "tiny-gpt2"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    fast.save_pretrained(model_dir)
    GPT2Config(
        vocab_size=len(fast),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=fast.eos_token_id,
        eos_token_id=fast.eos_token_id,
    ).save_pretrained(model_dir)
    return model_dir, train, valid


def _tqdm_steps(out: str, total: int) -> tuple[int, list[float]]:
    """The last count and rate (as ms per step) of the tqdm bar that counts to `total`."""
    bars = [
        (int(n), float(rate) * 1000 if unit == "s/it" else 1000 / float(rate))
        for n, t, rate, unit in re.findall(r"\| *(\d+)/(\d+) \[[^,\]]*, ([\d.]+)(it/s|s/it)\]", out)
        if int(t) == total
    ]
    return (bars[-1][0], [bars[-1][1]]) if bars else (0, [])


def hf_rows(examples: Path, work: Path) -> list[Row]:
    model_dir, train, valid = _tiny_hf_model(work)
    steps, batch, block = 20, 4, 32
    common = [
        "--config_name",
        str(model_dir),
        "--tokenizer_name",
        str(model_dir),
        "--train_file",
        str(train),
        "--validation_file",
        str(valid),
        "--block_size",
        str(block),
        "--seed",
        "0",
    ]
    rows = []
    if (examples / "run_clm.py").exists():

        def parse_trainer(out: str):
            losses = [float(v) for v in re.findall(r"'loss': '?([\d.]+)'?", out)]
            return len(losses), dict(enumerate(losses, 1)), []

        rows.append(
            Row(
                "HF run_clm.py (Trainer)",
                [
                    PY,
                    str(examples / "run_clm.py"),
                    *common,
                    "--model_type",
                    "gpt2",
                    "--do_train",
                    "--max_steps",
                    str(steps),
                    "--per_device_train_batch_size",
                    str(batch),
                    "--output_dir",
                    "out",
                    "--logging_steps",
                    "1",
                    "--report_to",
                    "none",
                    "--save_strategy",
                    "no",
                    "--use_cpu",
                    "--disable_tqdm",
                    "true",
                ],
                work,
                batch * block,
                parse_trainer,
                ["out/model.safetensors"],
            )
        )
    if (examples / "run_clm_no_trainer.py").exists():

        def parse_no_trainer(out: str):
            # It logs no training loss (only to an experiment tracker, none installed here) and
            # no step time: steps and step time from its tqdm bar (tqdm's smoothed rate).
            done, step_ms = _tqdm_steps(out, steps)
            return done, {}, step_ms

        rows.append(
            Row(
                "HF run_clm_no_trainer.py (accelerate, no Trainer)",
                [
                    PY,
                    str(examples / "run_clm_no_trainer.py"),
                    *common,
                    "--max_train_steps",
                    str(steps),
                    "--per_device_train_batch_size",
                    str(batch),
                    "--output_dir",
                    "out-no-trainer",
                ],
                work,
                batch * block,
                parse_no_trainer,
                ["out-no-trainer/model.safetensors", "out-no-trainer/all_results.json"],
            )
        )
    return rows


# ---- pytorch/examples ------------------------------------------------------------------------


def pytorch_rows(checkout: Path, work: Path) -> list[Row]:
    src = checkout / "word_language_model"
    data = work / "wikitext-tiny"
    data.mkdir()
    wiki = src / "data" / "wikitext-2"
    for name, n in (("train.txt", 400), ("valid.txt", 60), ("test.txt", 60)):
        # A partial checkout may lack the 10 MB train.txt: its valid.txt trains as well.
        source = wiki / name if (wiki / name).stat().st_size else wiki / "valid.txt"
        with open(source) as f:
            (data / name).write_text("".join(f.readline() for _ in range(n)))
    bptt, batch = 16, 20
    # The true tokens per step from the example's own corpus reader: the last bptt window of the
    # epoch is shorter than the others.
    sys.path.insert(0, str(src))
    try:
        import data as wlm_data

        rows_per_column = len(wlm_data.Corpus(str(data)).train) // batch
    finally:
        sys.path.remove(str(src))
    windows = [min(bptt, rows_per_column - 1 - i) * batch for i in range(0, rows_per_column - 1, bptt)]

    def parse(out: str):
        # It logs every batch but the first, and its first line sums the losses of batches 0
        # and 1 (its running total is not reset after batch 0): compare from batch 2 on.
        found = re.findall(r"\|\s+(\d+)/\s*\d+ batches .*?ms/batch\s+([\d.]+) \| loss\s+([\d.]+)", out)
        return (
            len(found) + 1,
            {int(b) + 1: float(loss) for b, _, loss in found[1:]},
            [float(ms) for _, ms, _ in found],
        )

    return [
        Row(
            "pytorch/examples word_language_model (hand SGD)",
            [
                PY,
                str(src / "main.py"),
                "--data",
                str(data),
                "--epochs",
                "1",
                "--emsize",
                "16",
                "--nhid",
                "16",
                "--nlayers",
                "1",
                "--bptt",
                str(bptt),
                "--batch_size",
                str(batch),
                "--log-interval",
                "1",
                "--save",
                "wlm.pt",
            ],
            work,
            windows,
            parse,
            ["wlm.pt"],
        ),
        *_gan_and_lbfgs_rows(checkout, work),
    ]


def _shims(*packages: str) -> dict:
    """PYTHONPATH with bench/realworld_shims when one of `packages` is not installed here."""
    import importlib.util

    if all(importlib.util.find_spec(p) for p in packages):
        return {}
    return {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "bench" / "realworld_shims"), os.environ.get("PYTHONPATH")])
        )
    }


def _gan_and_lbfgs_rows(checkout: Path, work: Path) -> list[Row]:
    gan = work / "dcgan"
    gan.mkdir()
    dcgan_line = re.compile(r"^\[0/1\]\[(\d+)/\d+\] Loss_D: ([\d.]+) Loss_G: ([\d.]+)", re.M)

    def parse_gan(out: str):
        found = dcgan_line.findall(out)
        return len(found), {int(i) + 1: float(d) for i, d, _ in found}, []

    def gan_losses(out: str):
        return {int(i) + 1: {"netD": float(d), "netG": float(g)} for i, d, g in dcgan_line.findall(out)}

    # 1000 fake 64x64 images (FakeData's default), batch 32: 32 iterations of D then G.
    rows = [
        Row(
            "pytorch/examples dcgan (D then G, two optimisers)",
            [
                PY,
                str(checkout / "dcgan" / "main.py"),
                "--dataset",
                "fake",
                "--niter",
                "1",
                "--batchSize",
                "32",
                "--ngf",
                "8",
                "--ndf",
                "8",
                "--nz",
                "16",
                "--workers",
                "0",
                "--manualSeed",
                "1",
                "--outf",
                str(gan),
            ],
            gan,
            [],
            parse_gan,
            ["netG_epoch_0.pth", "netD_epoch_0.pth"],
            _shims("torchvision"),
            per_step=gan_losses,
        )
    ]
    seq = work / "time_sequence"
    seq.mkdir()
    # generate_sine_wave.py's sine waves, 10 of 100 points instead of 100 of 1000 (LBFGS's 20
    # evaluations of 1000 LSTM steps take minutes a step on a shared CPU).
    subprocess.run(
        [
            PY,
            "-c",
            "import numpy as np, torch; np.random.seed(2); T, L, N = 20, 100, 10; "
            "x = np.empty((N, L), 'int64'); x[:] = np.array(range(L)) + "
            "np.random.randint(-4 * T, 4 * T, N).reshape(N, 1); "
            "torch.save(np.sin(x / 1.0 / T).astype('float64'), open('traindata.pt', 'wb'))",
        ],
        cwd=seq,
        check=True,
        timeout=300,
    )

    def steps_of(out: str) -> list[list[float]]:
        """Each step's closure evaluations' losses (its `loss:` lines; `test loss:` is the eval)."""
        steps: list[list[float]] = []
        for line in out.splitlines():
            if line.startswith("STEP:"):
                steps.append([])
            elif line.startswith("loss:") and steps:
                steps[-1].append(float(line.split()[1]))
        return steps

    def parse_seq(out: str):
        steps = steps_of(out)
        return len(steps), {n: evals[0] for n, evals in enumerate(steps, 1) if evals}, []

    def seq_evals(out: str):
        return {n: {"closure_evals": len(evals)} for n, evals in enumerate(steps_of(out), 1)}

    rows.append(
        Row(
            "pytorch/examples time_sequence_prediction (LBFGS closure)",
            [PY, str(checkout / "time_sequence_prediction" / "train.py"), "--steps", "2"],
            seq,
            [],
            parse_seq,
            [],
            {**_shims("matplotlib"), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
            per_step=seq_evals,
        )
    )  # (it torch.load()s a numpy array: refused by weights_only)
    return rows


# ---- Lightning examples ----------------------------------------------------------------------


def lightning_rows(examples: Path, work: Path) -> list[Row]:
    tree = work / "lightning"
    (tree / "data").mkdir(parents=True)
    # WikiText2 reads data/wikitext-2.txt and downloads only when it is missing. The script holds
    # out 2 x 2000 blocks of 35 tokens and trains on the rest: 6735 lines of 21 tokens (20 words
    # and <eos>) make 4040 blocks, 40 training samples, 2 batches of 20 an epoch, 20 epochs.
    words = ["the", "model", "learns", "to", "count", "tokens", "on", "a", "shared", "server"]
    lines = [" ".join(words[(i * 7 + j * (i % 5 + 1)) % len(words)] for j in range(20)) for i in range(6735)]
    (tree / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")
    logs = "lightning_logs/version_0"

    def parse(out: str):
        # Its CSVLogger's train_loss, every step (PL_TRAINER_LOG_EVERY_N_STEPS=1); its step
        # column counts from 0, ours from 1. No step time in its log.
        try:
            with open(tree / logs / "metrics.csv") as f:
                losses = {
                    int(r["step"]) + 1: float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]
                }
        except FileNotFoundError:  # the run failed before logging: its exit status says so
            losses = {}
        return len(losses), losses, []

    # Lightning's Trainer takes defaults from PL_TRAINER_* variables (the script passes neither):
    # 2 validation and test batches instead of 100 each, the loss logged at every step.
    env = {
        "PL_TRAINER_LIMIT_VAL_BATCHES": "2",
        "PL_TRAINER_LIMIT_TEST_BATCHES": "2",
        "PL_TRAINER_LOG_EVERY_N_STEPS": "1",
    }
    return [
        Row(
            "Lightning examples/pytorch/basics/transformer.py",
            [PY, str(examples / "pytorch" / "basics" / "transformer.py")],
            tree,
            20 * 35,
            parse,
            [f"{logs}/checkpoints/epoch=19-step=40.ckpt", f"{logs}/metrics.csv"],
            env,
            ["lightning_logs"],
        )
    ]


# ---- ours ------------------------------------------------------------------------------------


def our_rows(work: Path) -> list[Row]:
    return [
        Row(
            "EMA deepcopy + torch.save(model)",
            [PY, str(OURS / "ema_whole_model.py"), "ckpt", "30"],
            work,
            8 * 32,
            _ours_parse,
            ["ckpt/model.pt", "ckpt/ema.pt"],
        ),
        Row(
            "Lightning, loss in training_step",
            [PY, str(OURS / "lightning_loss_in_step.py"), "30"],
            work,
            8 * 32,
            _ours_parse,
        ),
        Row(
            "accelerate loop, no Trainer",
            [PY, str(OURS / "accelerate_loop.py"), "30"],
            work,
            8 * 32,
            _ours_parse,
            ["accelerate_state.pt"],
        ),
    ]


# ---- running and measuring -------------------------------------------------------------------


def _digest(cwd: Path, names: list[str]) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = hashlib.sha256((cwd / name).read_bytes()).hexdigest()
        except OSError:
            out[name] = None
    for name in names:  # the next run writes them afresh
        (cwd / name).unlink(missing_ok=True)
    return out


def hook_share(row: Row, data_home: Path, floor: bool = False) -> tuple[float, float] | None:
    """One more run under `gpuwatch run`, through bench/hook_share.py: the µs a step and the share
    (%) of the wall time between its first and last step spent inside gpuwatch's hooks (with
    `floor`, inside the floor's hooks, bench/floor_hooks.py, in their place); None if it has none."""
    out = data_home / "hook-share.json"
    timed = replace(
        row,
        cmd=[PY, str(ROOT / "bench" / "hook_share.py"), *row.cmd[1:]],
        env={**row.env, "HOOK_SHARE_OUT": str(out), **({"HOOK_SHARE_FLOOR": "1"} if floor else {})},
    )
    run_once(timed, True, data_home)
    try:
        figures = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    by_hook = sorted(figures.get("by_hook", {}).items(), key=lambda item: -item[1])
    print(
        f"      in the {'floor' if floor else 'hooks'} per step: "
        + ", ".join(
            f"{name} {spent / figures['steps'] * 1e6:.1f} µs" for name, spent in by_hook if spent > 0
        ),
        flush=True,
    )
    return figures["hook_s"] / figures["steps"] * 1e6, figures["hook_s"] / figures["wall_s"] * 100


def shares(row: Row, work: Path, runs: int, floor: bool) -> tuple[str, str]:
    """Ours' share, and with `floor` the floor's, over `runs` runs each (alternated): the medians,
    and the range when there are several (one run's share moves by a third on a shared VM)."""
    found: dict[bool, list] = {False: [], True: []}
    for n in range(runs):
        for which in (False, True) if floor else (False,):
            figures = hook_share(row, work / f"db-{'floor' if which else 'share'}-{id(row)}-{n}", which)
            if figures is not None:
                found[which].append(figures)
    return _share_cell(found[False]), _share_cell(found[True]) if floor else "-"


def _share_cell(found: list[tuple[float, float]]) -> str:
    if not found:
        return "-"
    cell = (
        f"{statistics.median(us for us, _ in found):.0f} µs = {statistics.median(p for _, p in found):.2f} %"
    )
    if len(found) > 1:
        cell += f" ({min(p for _, p in found):.2f}–{max(p for _, p in found):.2f} %)"
    return cell


def run_once(row: Row, instrumented: bool, data_home: Path) -> dict:
    # Fresh caches each run, so neither run reuses the other's compiled graphs or mapped datasets.
    caches = data_home / "caches"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        XDG_DATA_HOME=str(data_home),
        TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        HF_HOME=str(caches / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        **row.env,
    )
    cmd = [GPUWATCH, "run", "--", *row.cmd] if instrumented else row.cmd
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=row.cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    steps, losses, step_ms = row.parse(done.stdout + done.stderr)
    result = {
        "rc": done.returncode,
        "wall": wall,
        "steps": steps,
        "losses": losses,
        "step_ms": step_ms,
        "recompiles": done.stderr.count("Recompiling function"),
        "warnings": len(re.findall(r"UserWarning", done.stderr)),
        "files": _digest(row.cwd, row.outputs),
        "stderr": done.stderr,
        "stdout": done.stdout,
    }
    for folder in row.scratch:
        shutil.rmtree(row.cwd / folder, ignore_errors=True)
    return result


def recorded(data_home: Path) -> tuple[int, list, dict, dict]:
    conn = sqlite3.connect(data_home / "gpuwatch" / "gpuwatch.db")
    try:
        (run_id,) = conn.execute(
            "SELECT run_id FROM runs WHERE parent_run_id IS NULL ORDER BY started_ms DESC LIMIT 1"
        ).fetchone()
        rows = conn.execute(
            "SELECT step, tokens, loss, losses_json, closure_evals FROM steps WHERE run_id = ? ORDER BY step",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    per_step = {
        s: {**json.loads(named or "{}"), **({"closure_evals": evals} if evals is not None else {})}
        for s, _, _, named, evals in rows
    }
    return len(rows), [r[1] for r in rows], {r[0]: r[2] for r in rows}, per_step


def per_step_check(row: Row, out: str, recorded_per_step: dict) -> str:
    """Each optimiser's loss (or the closure's evaluation count) against the script's own log."""
    if row.per_step is None:
        return "-"
    logged = row.per_step(out)
    keys = sorted({k for values in logged.values() for k in values})
    parts = []
    for key in keys:
        pairs = [(v[key], recorded_per_step.get(s, {}).get(key)) for s, v in logged.items() if key in v]
        found = [(a, b) for a, b in pairs if b is not None]
        diff = max((abs(a - b) for a, b in found), default=None)
        parts.append(f"{key} {len(found)}/{len(pairs)}" + ("" if diff is None else f" max |diff| {diff:.2g}"))
    return "; ".join(parts) or "none logged"


def measure(row: Row, work: Path, repeat: int, floor: bool = False) -> dict:
    """Plain and instrumented runs alternated `repeat` times; times are pooled, everything else
    must hold in every pair. With `floor`, the floor's hooks' share too, beside ours."""
    pairs = []
    for n in range(repeat):
        plain = run_once(row, False, work / f"db-plain-{id(row)}-{n}")
        home = work / f"db-{id(row)}-{n}"
        pairs.append((plain, run_once(row, True, home), recorded(home)))
    share, floor_share = shares(row, work, repeat, floor)
    plain, instr, (n, tokens, losses, per_step) = pairs[0]
    common = [s for s in plain["losses"] if s in losses and losses[s] is not None]
    loss_diff = max((abs(plain["losses"][s] - losses[s]) for s in common), default=None)
    # Each pair's ratio of median step times (the first two steps, warm-up and compilation, left
    # out), then the median over pairs: a pair's two runs share the machine's state of the moment.
    step = [
        statistics.median(i["step_ms"][2:]) / statistics.median(p["step_ms"][2:])
        for p, i, _ in pairs
        if len(p["step_ms"]) > 2 and len(i["step_ms"]) > 2
    ]
    wall = [i["wall"] / p["wall"] for p, i, _ in pairs]
    same_files = all(p["files"] == i["files"] and None not in p["files"].values() for p, i, _ in pairs)
    true = row.tokens_per_step
    exact = tokens == true if isinstance(true, list) else set(tokens) == {true}
    if true == [] and set(tokens) == {None}:  # no token inputs (images, a time series): none counted
        tokens = []
    return {
        "row": row.name,
        "steps": " ".join(f"{r[0]}/{p['steps']}" for p, _, r in pairs),
        "tokens": "-" if not tokens else ("exact" if exact else "DIFFER"),
        "loss": "not logged"
        if not plain["losses"]
        else (
            f"{len(common)}/{len(plain['losses'])} steps, max |diff| {loss_diff:.2g}" if common else "missing"
        ),
        "step": f"{statistics.median(step):.3f} ({min(step):.2f}–{max(step):.2f})" if step else "-",
        "wall": f"{statistics.median(wall):.3f}",
        "share": share,
        "floor": floor_share,
        "per_step": per_step_check(row, instr["stdout"], per_step),
        "recompiles": " ".join(f"{i['recompiles']} vs {p['recompiles']}" for p, i, _ in pairs[:1]),
        "exit": " ".join(f"{i['rc']} vs {p['rc']}" for p, i, _ in pairs[:1]),
        "files": "-" if not row.outputs else ("byte-equal" if same_files else "DIFFER"),
        "plain stderr": plain["stderr"][-300:] if plain["rc"] else "",
    }


COLUMNS = [
    "row",
    "steps",
    "tokens",
    "loss",
    "per_step",
    "share",
    "floor",
    "step",
    "wall",
    "recompiles",
    "exit",
    "files",
]
HEADERS = [
    "script",
    "steps rec/done (each pair)",
    "tokens/step",
    "loss vs its log",
    "each optimiser's loss / closure evaluations vs its log",
    "in gpuwatch's hooks per step (share of step time; median of the runs, their range)",
    "in the floor's hooks (--floor: the least any hooks cost)",
    "step time ×",
    "wall ×",
    "recompiles (gw vs plain)",
    "exit (gw vs plain)",
    "saved files",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path)
    parser.add_argument("--hf-examples", type=Path)
    parser.add_argument("--pytorch-examples", type=Path)
    parser.add_argument("--lightning-examples", type=Path)
    parser.add_argument(
        "--only", action="append", help="run only the rows whose name contains this (repeatable)"
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="plain/instrumented pairs per script, and hook-share runs"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the floor's hooks (bench/floor_hooks.py: the least any hooks cost) in ours' place",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-realworld-") as tmp:
        work = Path(tmp)
        rows = our_rows(work)
        if args.nanogpt:
            rows += nanogpt_rows(args.nanogpt, work)
        if args.hf_examples:
            rows += hf_rows(args.hf_examples, work)
        if args.pytorch_examples:
            rows += pytorch_rows(args.pytorch_examples, work)
        if args.lightning_examples:
            rows += lightning_rows(args.lightning_examples, work)
        if args.only:
            rows = [r for r in rows if any(o.lower() in r.name.lower() for o in args.only)]
        results = []
        for n, row in enumerate(rows, 1):
            print(f"[{n}/{len(rows)}] {row.name} ...", file=sys.stderr, flush=True)
            results.append(measure(row, work, args.repeat, args.floor))
            if results[-1]["plain stderr"]:
                print(f"  plain run failed: {results[-1]['plain stderr']}", file=sys.stderr)
    print(
        f"load average {os.getloadavg()[0]:.1f}; OMP_NUM_THREADS=1; tiny sizes on the CPU; "
        f"{args.repeat} plain/gpuwatch pairs per script, alternated; step time: the median over pairs of "
        f"each pair's median-step ratio (its range in brackets); wall: the median pair's ratio"
    )
    shown = [(c, h) for c, h in zip(COLUMNS, HEADERS) if args.floor or c != "floor"]
    print("| " + " | ".join(h for _, h in shown) + " |")
    print("|" + "---|" * len(shown))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c, _ in shown) + " |")


if __name__ == "__main__":
    main()
