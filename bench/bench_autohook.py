"""Cost of the zero-code hooks of `gpuwatch run`, and how their tokens/s agree with the frameworks'.

1. Per-step cost on a model of 200+ submodules (CPU, embedded mode, the real transport): the time
   spent inside our hooks themselves (module-call enter/leave, our backward wrapper less torch's
   backward, the optimiser-step pre- and post-hooks with run.step), and the whole loop's step
   with and without the hooks, in blocks alternated in one process. `--clock cpu` times the
   hooks in the CPU time of the thread that runs them (time.thread_time, its own cost taken out):
   on a loaded host, preemption and waits for the GIL are left out, as wall time cannot.
   `--bytecodes` counts instead the Python bytecodes our code executes a step, on the training
   thread and gpuwatch's drainer thread (a figure no load changes; a torch call counts as one).
   `--vs-floor ROUNDS` alternates ours with hooks that do only what a step needs (floor_hooks):
   how far ours are from the least any Python hooks cost here, a ratio measured in one sitting.
   Goals: <= 40 µs per step and <= 1 % of a 10 ms step. Beside them, the CPU time per step of
   the thread that encodes the step events and sends them (its own clock: it never holds up a
   step, but it takes the GIL and a core's time from the training process).
   `--model gpt2`: a tiny Hugging Face GPT-2 in a plain loop instead of the 203-module model
   (keyword inputs, a ModelOutput holding the loss: the shape most hand-written loops over a
   Hugging Face model have).
   `--reinforce ROUNDS`: REINFORCE's shape instead (pytorch/examples reinforcement_learning's
   policy, called 200 times an optimiser step, one per environment step): µs a forward with and
   without the hooks, in blocks alternated in one process.
2. `gpuwatch run -- true`'s wall time: what the wrapper alone adds to a program's.
3. Tokens/s of an unmodified Hugging Face Trainer and Lightning script under `gpuwatch run` vs the
   framework's own figure over the same steps (the test scripts in tests/autorun_scripts).
   Goal: within 2 %.

    .venv/bin/python bench/bench_autohook.py [--steps 400] [--clock wall|cpu] [--bytecodes] [--skip-frameworks]
    .venv/bin/python bench/bench_autohook.py --vs-floor 6 [--model gpt2]
    .venv/bin/python bench/bench_autohook.py --reinforce 8
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from floor_hooks import floor_hooks

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "autorun_scripts"


# The loop measured: "modules", the 203-module model called as model(ids) returning logits; or
# "gpt2", a tiny Hugging Face GPT-2 called as model(input_ids=, labels=) returning its ModelOutput
# and loss, as a plain loop over a Hugging Face model trains it (--model).
MODEL = "modules"


def model_and_optimizer(torch):
    if MODEL == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)
        model = GPT2LMHeadModel(config)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    nn = torch.nn
    layers = [nn.Embedding(64, 16)]
    for _ in range(100):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(16, 64))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def step_times_us(torch, model, opt, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        x = torch.randint(0, 64, (4, 32))
        t0 = time.perf_counter_ns()
        if MODEL == "gpt2":
            model(input_ids=x, labels=x).loss.backward()
        else:
            torch.nn.functional.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()
        times.append((time.perf_counter_ns() - t0) / 1000)
    return times


CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}
clock = time.perf_counter_ns
READ_NS = 0  # what one reading of `clock` costs, taken out of each timed call


def use_clock(name: str) -> None:
    global clock, READ_NS
    clock = CLOCKS[name]
    pairs = []
    for _ in range(2000):
        t0 = clock()
        pairs.append(clock() - t0)
    READ_NS = statistics.median(pairs)


def timed(fn, spent: list):
    def wrapper(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(clock() - t0 - READ_NS)

    return wrapper


def timed_backward(wrap_backward, spent: list):
    """Our backward wrapper's calls, less the torch backward inside each (and the two clock
    readings that time it)."""

    def wrapping(backward):
        inner = [0]

        def torch_backward(*args, **kwargs):
            t0 = clock()
            try:
                return backward(*args, **kwargs)
            finally:
                inner[0] = clock() - t0

        recorded = wrap_backward(torch_backward)

        def outer(*args, **kwargs):
            t0 = clock()
            try:
                return recorded(*args, **kwargs)
            finally:
                spent.append(clock() - t0 - inner[0] - 3 * READ_NS)

        return outer

    return wrapping


def hook_cost(steps: int, whole_loop: bool = True) -> None:
    import torch

    from gpuwatch.integrations import autohook

    figures = measure_hooks(torch, autohook.AutoInstrument, steps)
    per_step, inside = figures["per_step"], figures["inside"]
    print(
        f"hook cost, {figures['modules']} modules, {steps} steps each way (median step {figures['plain']:.0f} µs "
        f"without gpuwatch; load average {os.getloadavg()[0]:.1f}):"
    )
    print(
        f"  inside our hooks ({'thread CPU time' if clock is time.thread_time_ns else 'wall time'}; calls' "
        "total per step, slowest 2 % left out): "
        + " + ".join(f"{name.strip('_')} {us:.1f} µs" for name, us in per_step.items())
        + f" (run.step() included) = {inside:.1f} µs per step = {inside / 100:.2f} % of a 10 ms step "
        f"({'met' if inside <= 40 else 'MISSED'}: <= 40 µs, <= 1 %)"
    )
    print(
        f"  and the thread that encodes the step events and sends them to the recorder (no daemon "
        f"here: the recorder helper's socket): {figures['sender']:.1f} µs of its CPU time per step"
    )
    if not whole_loop:
        return
    deltas = interleaved_deltas(torch, autohook, figures["model"], figures["opt"])
    low, mid, high = statistics.quantiles(deltas, n=4)
    plain = figures["plain"]
    print(
        f"  whole loop, {len(deltas)} pairs of {BLOCK}-step blocks with and without the hooks, alternated: "
        f"median step with - without {mid:+.1f} µs = {mid / plain * 100:+.2f} % (quartiles {low:+.1f}, "
        f"{high:+.1f} µs)"
    )


def measure_hooks(torch, hooks_class, steps: int) -> dict:
    """The time inside each hook of `hooks_class` (an AutoInstrument) per step, on a fresh model."""
    from gpuwatch.client import run as run_mod

    model, opt = model_and_optimizer(torch)
    step_times_us(torch, model, opt, 50)  # warm-up
    before = step_times_us(torch, model, opt, steps)
    hooks = hooks_class(torch)
    # Every hook of ours that runs in a step: the top-level forward's enter and leave (the loss
    # module called beside the model is a top-level call too), the backward's, the optimiser's.
    spent = {
        name: []
        for name in ("_enter", "_leave", "_reached_model", "_before_optimizer_step", "_on_optimizer_step")
    }
    for name, times in spent.items():
        setattr(hooks, name, timed(getattr(hooks, name), times))
    spent["backward"] = []
    hooks._wrap_backward = timed_backward(hooks._wrap_backward, spent["backward"])
    # and the step events gpuwatch's drainer thread builds (those of the training thread are in
    # the optimiser-step hook)
    spent["drainer thread"] = drains = []
    drain = run_mod.Run._drain
    run_mod.Run._drain = lambda run, wait: (
        drain(run, wait)
        if threading.current_thread() is threading.main_thread()
        else timed(drain, drains)(run, wait)
    )
    hooks.install()
    step_times_us(torch, model, opt, 5)  # the first iteration finds the model
    for times in spent.values():
        times.clear()
    sender = _thread_cpu_ns("gpuwatch-sender")
    step_times_us(torch, model, opt, steps)
    time.sleep(0.3)  # the last drain, and the sender's frame of it
    sender_us = (_thread_cpu_ns("gpuwatch-sender") - sender) / steps / 1000
    hooks.switch_off()
    hooks.run.finish()
    run_mod.Run._drain = drain
    # µs per step, each hook: its calls' total over the steps, less its slowest 2 % of calls (a
    # shared machine's preemptions); a mean, not a median, so work done every few steps counts.
    per_step = {name: _trimmed_total(times) / steps / 1000 for name, times in spent.items()}
    return {
        "per_step": per_step,
        "inside": sum(per_step.values()),
        "sender": sender_us,
        "plain": statistics.median(before),
        "modules": sum(1 for _ in model.modules()),
        "model": model,
        "opt": opt,
    }


def vs_floor(steps: int, rounds: int) -> None:
    """Ours and the floor's hooks (floor_hooks), alternated: the ratio holds however fast the
    machine is at the moment, as the µs do not."""
    import torch

    from gpuwatch.integrations import autohook

    floor = floor_hooks(autohook)
    print(f"inside the hooks per step, ours vs the floor's (least a step needs), {rounds} alternated rounds:")
    print("| round | ours µs | of which on the training thread | floor µs | ours / floor |")
    print("|---|---|---|---|---|")
    ratios, ours, training = [], [], []
    for n in range(rounds):
        figures = {}
        for name, cls in (("ours", autohook.AutoInstrument), ("floor", floor))[:: 1 if n % 2 else -1]:
            figures[name] = measure_hooks(torch, cls, steps)
        ours.append(figures["ours"]["inside"])
        training.append(ours[-1] - figures["ours"]["per_step"]["drainer thread"])
        ratios.append(ours[-1] / figures["floor"]["inside"])
        print(
            f"| {n + 1} | {ours[-1]:.1f} | {training[-1]:.1f} | {figures['floor']['inside']:.1f} | {ratios[-1]:.2f} |",
            flush=True,
        )
    print(
        f"median: ours {statistics.median(ours):.1f} µs, {statistics.median(training):.1f} µs of it on the "
        f"training thread; ours / floor {statistics.median(ratios):.2f} (load average {os.getloadavg()[0]:.1f}; "
        "ours include the drainer thread's work, the floor builds no events)"
    )


def reinforce(rounds: int, forwards: int = 200, episodes: int = 10) -> None:
    """µs a forward in REINFORCE's loop, with and without our hooks: blocks of `episodes`
    episodes alternated, `rounds` of each; medians."""
    import torch

    from gpuwatch.integrations import autohook

    nn, F = torch.nn, torch.nn.functional
    policy = nn.Sequential(nn.Linear(4, 128), nn.Dropout(p=0.6), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def episode() -> None:
        log_probs = []
        for _ in range(forwards):
            probs = F.softmax(policy(torch.randn(1, 4)), dim=1)
            log_probs.append(torch.log(probs.gather(1, probs.multinomial(1))))
        loss = -torch.cat(log_probs).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def block_us() -> float:
        started = time.perf_counter()
        for _ in range(episodes):
            episode()
        return (time.perf_counter() - started) / (episodes * forwards) * 1e6

    episode()
    times: dict[bool, list[float]] = {True: [], False: []}
    for n in range(rounds):
        for hooked in (True, False) if n % 2 else (False, True):
            hooks = autohook.AutoInstrument(torch) if hooked else None
            if hooks:
                hooks.install()
                episode()  # the model found
            times[hooked].append(block_us())
            if hooks:
                hooks.switch_off()
                hooks.run.finish()
    plain, ours = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"REINFORCE's shape, {forwards} forwards of a small policy an optimiser step, {rounds} alternated "
        f"rounds: {plain:.1f} µs a forward without gpuwatch, {ours:.1f} µs with its hooks: "
        f"+{ours - plain:.1f} µs = +{(ours / plain - 1) * 100:.1f} % (load average {os.getloadavg()[0]:.1f})"
    )


def bytecodes(steps: int) -> None:
    """Bytecodes executed in gpuwatch's own code per step (sys.settrace, opcode events)."""
    import torch

    from gpuwatch.integrations import autohook

    ours = os.sep + "gpuwatch" + os.sep
    counts = {"training thread": 0, "drainer thread": 0}
    where = ["training thread"]

    def tracer(frame, event, arg):
        if ours not in frame.f_code.co_filename:
            return None
        frame.f_trace_opcodes = True

        def local(frame, event, arg):
            if event == "opcode":
                counts[where[0]] += 1
            return local

        return local

    model, opt = model_and_optimizer(torch)
    hooks = autohook.AutoInstrument(torch)
    hooks.install()
    step_times_us(torch, model, opt, 20)  # the model found, the checks of the first iterations done
    hooks.run._drain(wait=True)
    # The drainer thread's work is done here, in one drain once the steps are taken: the same
    # events (one per step below 1000 steps a second, see fold.py), counted on this thread.
    hooks.run._drainer.stop()
    sys.settrace(tracer)
    step_times_us(torch, model, opt, steps)
    where[0] = "drainer thread"
    hooks.run._drain(wait=True)
    sys.settrace(None)
    hooks.switch_off()
    hooks.run.finish()
    print(
        f"bytecodes in gpuwatch's code per step, over {steps} steps: "
        + ", ".join(f"{name} {n / steps:.0f}" for name, n in counts.items())
    )


BLOCK, TIMED_FROM = 40, 15  # steps per block; the first ones (the hooks' first iterations) untimed


def interleaved_deltas(torch, autohook, model, opt, pairs: int = 16) -> list[float]:
    """Each pair: a block of steps without the hooks and one with fresh ones, in alternating
    order; its with - without difference of median steps. Neighbouring blocks share the
    machine's state of the moment, as two halves of a long run do not."""
    deltas = []
    for n in range(pairs):
        medians = {}
        for hooked in (False, True) if n % 2 else (True, False):
            hooks = autohook.AutoInstrument(torch) if hooked else None
            if hooks:
                hooks.install()
            medians[hooked] = statistics.median(step_times_us(torch, model, opt, BLOCK)[TIMED_FROM:])
            if hooks:
                hooks.switch_off()
                hooks.run.finish()
        deltas.append(medians[True] - medians[False])
    return deltas


def _thread_cpu_ns(name: str) -> int:
    """CPU time so far of this process's thread called `name` (0 if there is none)."""
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    return 0


def _trimmed_total(times: list[int]) -> float:
    """The sum of the calls' times, the slowest 2 % replaced by the mean of the rest."""
    if not times:
        return 0.0
    kept = sorted(times)[: max(1, int(len(times) * 0.98))]
    return statistics.fmean(kept) * len(times)


def wrapper_start(runs: int = 7) -> None:
    """What `gpuwatch run` adds to a program's wall time on its own (no daemon: it opens the
    embedded database, starts and stops its sampler, records the run): `-- true` against `true`."""
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    walls = {}
    for label, cmd in (("alone", ["true"]), ("under gpuwatch run", [gpuwatch, "run", "--", "true"])):
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times.append(time.perf_counter() - started)
        walls[label] = statistics.median(times)
    print(
        f"gpuwatch run -- true: {walls['under gpuwatch run']:.2f} s wall, `true` alone "
        f"{walls['alone'] * 1000:.0f} ms (median of {runs})"
    )


def framework_agreement() -> None:
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    for label, script, args in (
        ("Hugging Face Trainer", "hf_trainer.py", ["--pad"]),
        ("Lightning Trainer", "lightning_trainer.py", []),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, XDG_DATA_HOME=tmp, GPUWATCH_SOCKET=os.devnull)
            extra = [str(Path(tmp) / "out")] if script == "hf_trainer.py" else []
            done = subprocess.run(
                [gpuwatch, "run", "--", sys.executable, str(SCRIPTS / script), *extra, *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode:
                print(f"{label}: failed: {done.stderr.strip().splitlines()[-1]}")
                continue
            line = next(x for x in done.stdout.splitlines() if x.startswith("GPUWATCH_TEST "))
            theirs = _framework_rate(json.loads(line.removeprefix("GPUWATCH_TEST ")))
            conn = sqlite3.connect(Path(tmp) / "gpuwatch" / "gpuwatch.db")
            steps = conn.execute("SELECT tokens, step_time_ms FROM steps ORDER BY step").fetchall()[1:]
            conn.close()
            ours = sum(t for t, _ in steps) / (sum(ms for _, ms in steps) / 1000)
            off = (ours / theirs - 1) * 100
            print(
                f"{label}: zero-code {ours:.0f} tokens/s vs its own {theirs:.0f} tokens/s over steps 2..12: "
                f"{off:+.1f} % ({'met' if abs(off) <= 2 else 'MISSED'}: within 2 %)"
            )


def _framework_rate(figures: dict) -> float:
    logged = figures["logged"]
    if any("train/lengths" in m for m in logged):  # Lightning's ThroughputMonitor
        marks = [(m["train/lengths"], m["train/time"]) for m in logged if "train/lengths" in m]
    else:  # the Trainer's cumulative non-padding tokens and runtime at each logging step
        marks = [(m["num_input_tokens_seen"], m["train_runtime"]) for m in logged if "loss" in m]
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (t1 - t0) / (s1 - s0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="how hooks are timed")
    parser.add_argument("--skip-frameworks", action="store_true")
    parser.add_argument("--hooks-only", action="store_true", help="only the time inside the hooks")
    parser.add_argument("--bytecodes", action="store_true", help="count our bytecodes a step, and stop")
    parser.add_argument("--reinforce", type=int, metavar="ROUNDS", help="REINFORCE's loop shape, and stop")
    parser.add_argument(
        "--vs-floor",
        type=int,
        metavar="ROUNDS",
        help="ours against the least any hooks cost, alternated, and stop",
    )
    parser.add_argument(
        "--model",
        choices=("modules", "gpt2"),
        default="modules",
        help="the 203-module model (default) or a tiny Hugging Face GPT-2 in a plain loop",
    )
    args = parser.parse_args()
    global MODEL
    MODEL = args.model
    use_clock(args.clock)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(XDG_DATA_HOME=tmp, GPUWATCH_SOCKET=os.devnull)  # embedded mode, a fresh db
        try:
            if args.bytecodes:
                bytecodes(args.steps)
                return
            if args.reinforce:
                reinforce(args.reinforce)
                return
            if args.vs_floor:
                vs_floor(args.steps, args.vs_floor)
                return
            hook_cost(args.steps, whole_loop=not args.hooks_only)
            if not args.hooks_only:
                wrapper_start()
        finally:  # the runs' recorder helper ends before its database's directory is removed
            from gpuwatch.client import helpers

            helpers.stop_recorder()
    if not (args.skip_frameworks or args.hooks_only):
        framework_agreement()


if __name__ == "__main__":
    main()
