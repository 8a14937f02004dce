"""The reference workloads: real torch models, run as users run them, recorded in the embedded DB."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from gpuwatch.cli import main  # noqa: E402
from workloads import common, gpt_train, kv_generate, lstm_context  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 180


def run_workload(module: str, *args: str, launcher: list[str] | None = None) -> tuple[str, float]:
    """Run `python -m workloads.<module>` as a user would; returns stdout and wall seconds."""
    done, seconds = run_child(module, *args, launcher=launcher)
    assert done.returncode == 0, f"{' '.join(done.args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout, seconds


def run_child(module: str, *args: str, launcher: list[str] | None = None):
    cmd = (launcher or [sys.executable, "-m"]) + [f"workloads.{module}", *args]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    return done, time.monotonic() - started


def query(sql: str, *params) -> list[sqlite3.Row]:
    """Rows from the embedded per-user database the workloads wrote."""
    path = Path(os.environ["XDG_DATA_HOME"]) / "gpuwatch" / "gpuwatch.db"
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def args_for(module, *argv: str):
    p = module.parser()
    return common.parse_args(p, ["--tiny", "--device", "cpu", *argv])


# ---- recorded through the client, in a child process ----------------------------------------


@pytest.mark.slow
def test_gpt_train_records_every_step_with_plausible_rates():
    out, wall_s = run_workload("gpt_train", "--tiny", "--steps", "5", "--device", "cpu")
    result = common.parse_result(out)
    assert result["oom"] is False and result["tokens_per_s"] > 0
    assert result["peak_bytes"] > 50 * 2**20  # peak RSS of a process that imported torch

    (run,) = query("SELECT * FROM runs")
    assert (run["name"], run["status"], run["mode"]) == ("gpt-train", "finished", "embedded")
    config = json.loads(run["config_json"])
    assert config["attn"] == "sdpa" and config["seq_len"] == 64 and config["batch"] == 4
    assert run["flops_per_token"] > 6 * config["n_params"] * 0.5  # the helper's 6N + attention

    steps = query("SELECT * FROM steps WHERE run_id = ? ORDER BY step", run["run_id"])
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    for s in steps:
        assert s["tokens"] == 4 * 64 and s["samples"] == 4 and s["seq_len"] == 64
        assert 0 < s["step_time_ms"] < wall_s * 1000
        assert s["tokens_per_s"] == pytest.approx(s["tokens"] / (s["step_time_ms"] / 1000), rel=1e-6)
        assert 3 < s["loss"] < 9  # ln(512) = 6.24 for random tokens from an untrained model


@pytest.mark.slow
def test_lstm_counts_only_real_tokens():
    run_workload("lstm_context", "--tiny", "--steps", "4", "--device", "cpu")
    (run,) = query("SELECT run_id, name, status FROM runs")
    assert (run["name"], run["status"]) == ("lstm-context", "finished")
    steps = query("SELECT tokens, samples, seq_len, tokens_per_s FROM steps WHERE run_id = ?", run["run_id"])
    assert len(steps) == 4
    batch, min_len, max_len = 8, 8, 64  # the --tiny sizes
    for s in steps:
        assert s["seq_len"] == max_len and s["samples"] == batch
        assert batch * min_len <= s["tokens"] < batch * max_len  # padding is not counted
        assert s["tokens_per_s"] > 0
    assert len({s["tokens"] for s in steps}) > 1  # lengths vary batch to batch


def test_embedding_probe_reports_computed_output_size():
    out, _ = run_workload("embedding_probe", "--tiny", "--batch", "3", "--seq-len", "100", "--device", "cpu")
    result = common.parse_result(out)
    assert result["output_bytes"] == 3 * 100 * 128 * 4  # B * L * d * fp32
    assert "CUDA available:" in out and "output shape [3, 100, 128]" in out
    steps = query("SELECT tokens, seq_len, tokens_per_s FROM steps")
    assert [s["tokens"] for s in steps] == [300, 300, 300]
    assert all(s["tokens_per_s"] > 0 for s in steps)


def test_kv_generate_records_ttft_and_inter_token_latency():
    out, _ = run_workload(
        "kv_generate", "--tiny", "--generations", "2", "--new-tokens", "6", "--device", "cpu"
    )
    assert "TTFT" in out and "KV cache" in out
    (run,) = query("SELECT run_id, name, status FROM runs")
    assert (run["name"], run["status"]) == ("kv-generate", "finished")
    gens = query("SELECT * FROM generations WHERE run_id = ? ORDER BY gen_id", run["run_id"])
    assert [g["gen_id"] for g in gens] == [1, 2]
    for g in gens:
        assert (g["prompt_tokens"], g["new_tokens"]) == (48, 6)
        assert g["ttft_ms"] > 0 and 0 < g["itl_p50_ms"] <= g["itl_p90_ms"]
        assert g["tokens_per_s"] > 0
    # The peak the workload printed (peak RSS on a CPU) is in `gpuwatch runs`, as for training
    # runs: each generation records the peak so far (RSS at its end, at most the process's peak).
    printed = common.parse_result(out)["peak_bytes"]
    listed = CliRunner().invoke(main, ["runs", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    (summary,) = json.loads(listed.output)
    assert 50 * 2**20 < summary["peak_mem_bytes"] <= printed
    table = CliRunner().invoke(main, ["runs"]).output.splitlines()
    peak_column = table[0].index("PEAK MEM")
    assert table[1][peak_column : peak_column + 9].strip().endswith("MiB")


def test_running_out_of_memory_ends_the_run_as_oom_with_a_result_line():
    # Naive attention over a million positions asks for a 4 TB score tensor: refused at once.
    done, _ = run_child(
        "gpt_train",
        "--tiny",
        "--attn",
        "naive",
        "--seq-len",
        "1000000",
        "--batch",
        "1",
        "--d-model",
        "8",
        "--heads",
        "1",
        "--layers",
        "1",
        "--vocab",
        "16",
        "--steps",
        "1",
        "--device",
        "cpu",
    )
    assert done.returncode == 1
    assert common.parse_result(done.stdout)["oom"] is True
    assert "out of memory at batch 1 x seq 1000000" in done.stderr and "Traceback" not in done.stderr
    (run,) = query("SELECT status FROM runs")
    assert run["status"] == "oom"


# ---- the models themselves, in-process ---------------------------------------------------------


def test_naive_and_sdpa_attention_give_the_same_loss_and_gradients():
    results = {}
    for attn in ("naive", "sdpa"):
        args = args_for(gpt_train, "--attn", attn, "--seed", "3")
        model = gpt_train.build_model(args)
        x, y = gpt_train.synthetic_batch(args, torch.Generator().manual_seed(3), "cpu")
        _, loss = model(x, y)
        loss.backward()
        results[attn] = (loss.item(), model.blocks[0].attn.qkv.weight.grad.clone())
    assert results["naive"][0] == pytest.approx(results["sdpa"][0], abs=1e-5)
    torch.testing.assert_close(results["naive"][1], results["sdpa"][1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
def test_attention_is_causal(attn):
    args = args_for(gpt_train, "--attn", attn)
    model = gpt_train.build_model(args).eval()
    x = torch.randint(0, args.vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    changed = x.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % args.vocab  # change only the future
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_checkpointing_changes_memory_not_maths():
    grads = []
    for flags in ((), ("--checkpointing",)):
        args = args_for(gpt_train, *flags)
        model = gpt_train.build_model(args).train()
        x, y = gpt_train.synthetic_batch(args, torch.Generator().manual_seed(0), "cpu")
        model(x, y)[1].backward()
        grads.append(model.tok_emb.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
def test_kv_cache_decoding_matches_recomputing_the_whole_sequence(attn):
    args = args_for(kv_generate, "--attn", attn, "--prompt-len", "12", "--new-tokens", "8")
    args.seq_len, args.checkpointing = args.prompt_len + args.new_tokens, False
    model = gpt_train.build_model(args).eval()
    prompt = torch.randint(0, args.vocab, (2, 12), generator=torch.Generator().manual_seed(5))

    class Counter:
        tokens = 0

        def token(self, n=1):
            self.tokens += n

    counter = Counter()
    with torch.no_grad():
        new, times, cache_bytes = kv_generate.generate_once(
            model, prompt, 8, args, torch.device("cpu"), counter, torch.Generator()
        )
        seq = prompt
        for _ in range(8):  # no cache: the whole sequence every time
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(new, seq[:, 12:])
    assert counter.tokens == 2 * 8 and len(times) == 9
    assert cache_bytes == 2 * 2 * 2 * 4 * 20 * 16 * 4  # k+v, layers, batch, heads, positions, head dim, fp32


def test_lstm_padding_does_not_change_the_real_positions():
    args = args_for(lstm_context)
    torch.manual_seed(0)
    model = lstm_context.ContextualModel(args.vocab, args.embed_dim, args.hidden_dim).eval()
    x = torch.randint(1, args.vocab, (1, 20))
    with torch.no_grad():
        short = model(x[:, :12], torch.tensor([12]))
        padded = model(torch.cat([x[:, :12], torch.zeros(1, 8, dtype=torch.long)], dim=1), torch.tensor([12]))
    torch.testing.assert_close(short, padded[:, :12])


# ---- bad input: one clear line ----------------------------------------------------------------


def test_asking_for_cuda_without_one_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exc:
        gpt_train.main(["--tiny", "--device", "cuda"])
    assert "torch.cuda.is_available() is False" in str(exc.value.code)


def test_bad_shapes_are_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exc:
        gpt_train.main(["--tiny", "--d-model", "66", "--heads", "4"])
    assert exc.value.code == 2
    assert "--d-model 66 is not divisible by --heads 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lstm_context.main(["--tiny", "--min-len", "0"])
    assert "--min-len must be positive" in capsys.readouterr().err


def test_workloads_use_only_the_public_client_api():
    """DESIGN.md: workloads import torch and gpuwatch's client, never the store or the daemon."""
    import ast

    for path in sorted((REPO / "workloads").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.startswith("gpuwatch"):
                    assert name == "gpuwatch" or name.startswith("gpuwatch.client"), (
                        f"{path.name} imports {name}"
                    )


# ---- the same workloads on a real GPU (skipped where no NVIDIA driver answers) ----------------


@pytest.mark.gpu
def test_gpt_train_on_cuda_records_cuda_peak_memory_and_event_step_times():
    out, wall_s = run_workload("gpt_train", "--tiny", "--steps", "5", "--device", "cuda")
    result = common.parse_result(out)
    assert result["oom"] is False and result["tokens_per_s"] > 0
    steps = query("SELECT step_time_ms, mem_allocated_bytes, mem_peak_bytes FROM steps ORDER BY step")
    assert len(steps) == 5
    assert all(0 < s["step_time_ms"] < wall_s * 1000 for s in steps)
    # CUDA allocator figures, not RSS: the peak is the allocator's, and the result agrees.
    assert all(s["mem_allocated_bytes"] and s["mem_peak_bytes"] >= s["mem_allocated_bytes"] for s in steps)
    assert result["peak_bytes"] >= max(s["mem_peak_bytes"] for s in steps)


@pytest.mark.gpu
def test_kv_generate_on_cuda_lists_the_cuda_peak_it_printed():
    out, _ = run_workload(
        "kv_generate", "--tiny", "--generations", "2", "--new-tokens", "6", "--device", "cuda"
    )
    printed = common.parse_result(out)["peak_bytes"]
    # The allocator's peak after the last generation is the peak the workload printed at its end.
    assert query("SELECT max(mem_peak_bytes) AS peak FROM generations")[0]["peak"] == printed
    listed = CliRunner().invoke(main, ["runs", "--format", "json"])
    assert json.loads(listed.output)[0]["peak_mem_bytes"] >= printed


@pytest.mark.gpu
@pytest.mark.parametrize(
    "module, args",
    [
        ("kv_generate", ["--generations", "2", "--new-tokens", "6"]),
        ("embedding_probe", ["--batch", "3", "--seq-len", "100"]),
        ("lstm_context", ["--steps", "4"]),
    ],
)
def test_the_other_workloads_run_on_cuda(module, args):
    out, _ = run_workload(module, "--tiny", *args, "--device", "cuda")
    (run,) = query("SELECT status FROM runs")
    assert run["status"] == "finished", out


@pytest.mark.gpu
def test_a_cuda_oom_ends_the_run_as_oom_with_a_gpu_postmortem():
    done, _ = run_child(
        "gpt_train",
        "--tiny",
        "--attn",
        "naive",
        "--seq-len",
        "1000000",
        "--batch",
        "1",
        "--d-model",
        "8",
        "--heads",
        "1",
        "--layers",
        "1",
        "--vocab",
        "16",
        "--steps",
        "1",
        "--device",
        "cuda",
    )
    assert done.returncode == 1 and common.parse_result(done.stdout)["oom"] is True
    (pm,) = query("SELECT kind, phase, requested_bytes, free_bytes FROM oom_postmortems")
    assert (pm["kind"], pm["phase"]) == ("gpu", "forward")
    assert pm["requested_bytes"] >= 10**12 > pm["free_bytes"]  # 1e6² scores: terabytes
