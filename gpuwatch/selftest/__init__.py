"""`gpuwatch selftest`: does gpuwatch tell the truth on this machine?

Each check measures gpuwatch's figure and an independent one at the same moment and hands both to
`compare` (pure functions, unit-tested against recorded nvidia-smi output). What the machine lacks
(no driver, no torch with CUDA, no MIG, no py-spy) is skipped with the reason; torch is only
imported by the probe process (`probe.py`).
"""

from __future__ import annotations

import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from gpuwatch.selftest import compare
from gpuwatch.selftest.compare import Verdict

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"
TICKS_FULL, TICKS_QUICK = 20, 5
PROBE_TIMEOUT_S = 240


def _run_text(args: list[str], timeout: float = 30.0) -> str | None:
    """A command's stdout, or None if it is missing or fails."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _load_pynvml():
    import pynvml

    return pynvml


@dataclass
class Env:
    """How selftest reaches the machine; tests replace the NVML module and nvidia-smi's output."""
    nvml: Callable[[], object] = _load_pynvml
    smi: Callable[[list[str]], str | None] = lambda args: _run_text(["nvidia-smi", *args])
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    quick: bool = False
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpuwatch-selftest-")))
    user: str = field(default_factory=lambda: pwd.getpwuid(os.getuid()).pw_name)


def _collector(env: Env):
    from collectors.nvml import NvmlCollector

    return NvmlCollector(nvml=env.nvml())


# ---- checks that need no GPU ---------------------------------------------------------------------

def check_host(env: Env) -> list[Verdict]:
    import psutil

    from collectors.host import HostCollector

    host = HostCollector()
    try:
        s = host.sample(int(time.time() * 1000))
    finally:
        host.close()
    total = psutil.virtual_memory().total
    ok = s.mem_total_bytes == total
    return [Verdict("host memory total", OK if ok else FAIL,
                    f"gpuwatch {s.mem_total_bytes} B, psutil {total} B (equal)")]


def check_database(env: Env) -> list[Verdict]:
    from gpuwatch.store import open_ro, open_rw

    path = env.scratch / "db-check.db"
    conn = open_rw(path)
    conn.execute("INSERT INTO runs (run_id, uid, status, started_ms) VALUES ('selftest', ?, 'finished', 1)",
                 (os.getuid(),))
    conn.commit()
    conn.close()
    ro = open_ro(path)
    try:
        got = ro.execute("SELECT status FROM runs WHERE run_id = 'selftest'").fetchone()
        mode = ro.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        ro.close()
    ok = got == ("finished",) and mode == "wal"
    return [Verdict("database", OK if ok else FAIL, f"wrote and read back a run in {path.name} (journal {mode})")]


def check_daemon(env: Env) -> list[Verdict]:
    """A real daemon on a scratch socket and database; a tracked run's steps arrive with our uid."""
    sock, db = env.scratch / "d.sock", env.scratch / "daemon.db"
    daemon = subprocess.Popen([sys.executable, "-c", "from gpuwatch.cli import main; main()", "daemon", "--user", "--db", str(db),
                               "--socket", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        for _ in range(200):
            if sock.exists() or daemon.poll() is not None:
                break
            time.sleep(0.05)
        if not sock.exists():
            return [Verdict("daemon round trip", FAIL, f"the daemon did not open {sock}: "
                            f"{(daemon.communicate(timeout=5)[1] or '').strip()[-200:]}")]
        code = ("import gpuwatch\n"
                "with gpuwatch.track(name='selftest-daemon') as r:\n"
                "    [r.step(tokens=10) for _ in range(5)]\n"
                "print(r.run_id, r._transport.mode)\n")
        env_vars = {**os.environ, "GPUWATCH_SOCKET": str(sock)}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env_vars)
        run_id, mode = (out.stdout.split() + ["", ""])[:2]
        from gpuwatch.store import open_ro

        conn = open_ro(db)
        try:
            row = conn.execute("SELECT uid, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) "
                               "FROM runs r WHERE run_id = ?", (run_id,)).fetchone()
        finally:
            conn.close()
        ok = mode == "daemon" and row == (os.getuid(), 5)
        return [Verdict("daemon round trip", OK if ok else FAIL,
                        f"client mode {mode or '?'}; run stored with uid and steps {row} "
                        f"(expected ({os.getuid()}, 5)) {out.stderr.strip()[-200:]}".strip())]
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()


def check_pyspy(env: Env) -> list[Verdict]:
    from collectors import pyspy

    if pyspy.find_py_spy() is None:
        return [Verdict("py-spy stacks", SKIPPED, "py-spy is not installed (pip install py-spy)")]
    child = subprocess.Popen([sys.executable, "-c", "import time\ndef selftest_waits():\n    time.sleep(60)\n"
                              "print('ready', flush=True)\nselftest_waits()"], stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        dump = pyspy.dump(child.pid, int(time.time() * 1000))
    finally:
        child.kill()
        child.wait()
    if dump.error:
        return [Verdict("py-spy stacks", SKIPPED if "ptrace" in dump.error.lower() else FAIL, dump.error)]
    names = {f.get("name") for t in dump.threads for f in t.get("frames", [])}
    ok = "selftest_waits" in names
    return [Verdict("py-spy stacks", OK if ok else FAIL, "the child's frame selftest_waits "
                    + ("found" if ok else f"missing from {sorted(n for n in names if n)[:5]}"))]


# ---- NVML against nvidia-smi --------------------------------------------------------------------

def _persistence(nvml, handle) -> int | None:
    fn = getattr(nvml, "nvmlDeviceGetPersistenceMode", None)
    try:
        return None if fn is None else int(fn(handle))
    except nvml.NVMLError:
        return None


def check_nvml(env: Env, collector) -> list[Verdict]:
    text = env.smi([f"--query-gpu={compare.SMI_GPU_QUERY}", "--format=csv,noheader,nounits"])
    if text is None:
        return [Verdict("NVML vs nvidia-smi", SKIPPED, "nvidia-smi is missing or failed")]
    collector.sample(int(time.time() * 1000))  # the first tick primes per-process utilisation
    samples, _ = collector.sample(int(time.time() * 1000))
    text = env.smi([f"--query-gpu={compare.SMI_GPU_QUERY}", "--format=csv,noheader,nounits"]) or text
    by_uuid = {row["uuid"]: row for row in compare.parse_smi_csv(text, compare.SMI_GPU_QUERY)}
    nvml = collector._nvml
    out = []
    for static, sample in zip(collector.static, samples):
        label = f"GPU {static.gpu_index}"
        row = by_uuid.get(static.uuid)
        if row is None:
            out.append(Verdict(label, FAIL, f"{static.uuid} not listed by nvidia-smi"))
            continue
        handle = nvml.nvmlDeviceGetHandleByIndex(static.gpu_index)
        out.extend(compare.compare_gpu(label, compare.our_gpu_values(static, sample, _persistence(nvml, handle)), row))
    return out


def check_processes(env: Env, collector, probe_pid: int, held_bytes: int, device_uuid: str) -> list[Verdict]:
    from collectors.processes import ProcessCollector

    _, procs = collector.sample(int(time.time() * 1000))
    apps_text = env.smi([f"--query-compute-apps={compare.SMI_APPS_QUERY}", "--format=csv,noheader,nounits"])
    apps = compare.parse_smi_csv(apps_text or "", compare.SMI_APPS_QUERY)
    gpu_index = next((s.gpu_index for s in collector.static if s.uuid == device_uuid), None)
    mine = [p for p in procs if p.pid == probe_pid and p.gpu_index == gpu_index]
    pc = ProcessCollector()
    try:
        info = pc.info(probe_pid)
    finally:
        pc.close()
    return compare.compare_process(probe_pid, device_uuid, mine[0].used_mem_bytes if mine else None,
                                   info.user if info else None, env.user, apps, held_bytes)


def check_sampling_cost(env: Env, collector) -> list[Verdict]:
    from collectors.nvml import PCIE_MAX_SHARE

    ticks, shares = [], []
    for _ in range(TICKS_QUICK if env.quick else TICKS_FULL):
        was_separate = collector.pcie_separate
        collector.sample(int(time.time() * 1000))
        ticks.append(collector.last_sample_s * 1000)
        if not was_separate:
            shares.append(collector.last_pcie_s / max(collector.last_sample_s, 1e-9))
    p50 = statistics.median(ticks)
    share = statistics.median(shares) if shares else 0.0
    moved = "moved to their own job" if collector.pcie_separate else "kept in the tick"
    ok = p50 < 500  # half of the default 1 s interval: a tick must never run into the next one
    return [Verdict(f"sampling cost ({len(collector.static)} GPUs)", OK if ok else FAIL,
                    f"tick p50 {p50:.1f} ms (must stay < 500 ms); PCIe counters {share:.0%} of a "
                    f"tick (limit {PCIE_MAX_SHARE:.0%}): {moved}")]


def check_mig(env: Env, collector) -> list[Verdict]:
    enabled = [s for s in collector.static if s.mig_mode == 1]
    if not enabled:
        return [Verdict("MIG", SKIPPED, "MIG is not enabled on any GPU here")]
    listing = compare.mig_devices_by_gpu(env.smi(["-L"]) or "")
    nvml, out = collector._nvml, []
    for s in enabled:
        handle = nvml.nvmlDeviceGetHandleByIndex(s.gpu_index)
        ours = _mig_device_count(nvml, handle)
        theirs = listing.get(s.uuid, 0)
        out.append(Verdict(f"GPU {s.gpu_index} MIG devices", OK if ours == theirs else FAIL,
                           f"NVML {ours}, nvidia-smi -L {theirs} (equal)"))
    return out


def _mig_device_count(nvml, handle) -> int:
    """MIG devices NVML lists under a GPU (slots up to its maximum may be empty)."""
    count = 0
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            count += 1
        except nvml.NVMLError_NotFound:
            pass
    return count


# ---- the CUDA probe ------------------------------------------------------------------------------

def _probe_checks(env: Env, collector) -> list[Verdict]:
    """Run probe.py; check each of its measurements as it arrives."""
    env_vars = {**os.environ, "GPUWATCH_DB": str(env.scratch / "probe.db"),
                "GPUWATCH_SOCKET": str(env.scratch / "no-daemon.sock")}
    args = [sys.executable, "-m", "gpuwatch.selftest.probe"] + (["--quick"] if env.quick else [])
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env_vars)
    out: list[Verdict] = []
    timed_out = threading.Event()

    def kill() -> None:  # a hung CUDA call must not hang selftest
        timed_out.set()
        child.kill()
    watchdog = threading.Timer(PROBE_TIMEOUT_S, kill)
    watchdog.start()
    try:
        for line in child.stdout:
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = m.get("probe")
            env.progress(f"  probe: {kind}")
            if kind == "error":
                return [Verdict("CUDA checks", SKIPPED, m["error"])]
            if kind == "process":
                uuid = m.get("uuid") or _device_uuid(collector, m["device"])
                out += check_processes(env, collector, m["pid"], m["held_bytes"], uuid)
                out += _run_linked(env, m["run_id"], m["pid"])
                child.stdin.write("go\n")
                child.stdin.flush()
            out += judge_probe(m)
        child.wait(30)
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
    if timed_out.is_set():
        out.append(Verdict("CUDA probe", FAIL, f"killed after running past {PROBE_TIMEOUT_S} s"))
    elif child.returncode != 0:
        out.append(Verdict("CUDA probe", FAIL, f"the probe process exited with status {child.returncode}"))
    return out


def judge_probe(m: dict) -> list[Verdict]:
    """The verdicts for one line of probe output (the process line is judged by the caller)."""
    kind = m.get("probe")
    if kind == "torch":
        return [Verdict("torch", OK, f"torch {m['version']} CUDA {m['cuda']} on {m['device']}")]
    if kind == "memory_stats":
        missing = compare.missing_stats_keys(dict.fromkeys(m["keys"]), tuple(m["stored"]))
        return [Verdict("memory_stats() keys", FAIL if missing else OK,
                        f"missing: {', '.join(missing)}" if missing else f"all {len(m['stored'])} stored keys present")]
    if kind == "step_timing":
        return [compare.compare_step_times(m["event_ms"], m["wall_ms"]),
                compare.compare_loop_times(m["tracked_s"], m["untracked_s"], m["sync_errors"])]
    if kind == "sync_error":
        return [Verdict("synchronize in step()", FAIL, m["error"])]
    if kind == "profiler":
        return [compare.matmul_device_times(m["ops"])]
    if kind == "oom":
        if not m["postmortem"].get("phase"):
            return [Verdict("OOM postmortem", FAIL, "no postmortem was stored for the OOM run")]
        return compare.compare_oom(m["postmortem"], m["batch"], m["heads"], m["seq_len"], m["dtype_bytes"],
                                   m["free_now"], m["reserved_now"]) + (
            [] if compare.advised_length(m["postmortem"]["advice"]) else
            [Verdict("OOM advice fits", FAIL, "the advice gives no 'L ≤ N fits'")])
    if kind == "oom_fits":
        return [Verdict("OOM advice fits", OK if m["fits"] else FAIL,
                        f"ran naive attention at the advised L = {m['seq_len']}: "
                        + ("fits" if m["fits"] else m.get("error", "out of memory")))]
    if kind == "failed":
        return [Verdict(m["name"], FAIL, m["error"])]
    return []


def _device_uuid(collector, cuda_index: int) -> str:
    """The NVML UUID of torch's device `cuda_index`, through CUDA_VISIBLE_DEVICES when it is set."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    wanted = visible[cuda_index] if cuda_index < len(visible) else str(cuda_index)
    for s in collector.static:
        if wanted in (str(s.gpu_index), s.uuid):
            return s.uuid
    return wanted


def _run_linked(env: Env, run_id: str, pid: int, wait_s: float = 15.0) -> list[Verdict]:
    """The probe's embedded sampler links its GPU process to its run (within a run-map refresh)."""
    from gpuwatch.store import StoreError, open_ro

    found = None
    deadline = time.monotonic() + wait_s
    while found is None and time.monotonic() < deadline:
        try:
            conn = open_ro(env.scratch / "probe.db")
            try:
                found = conn.execute("SELECT run_id FROM processes WHERE pid = ? AND run_id IS NOT NULL",
                                     (pid,)).fetchone()
            finally:
                conn.close()
        except StoreError:
            pass  # not created yet
        if found is None:
            time.sleep(0.5)
    ok = found is not None and found[0] == run_id
    return [Verdict("process linked to its run", OK if ok else FAIL,
                    f"pid {pid} is stored with run {found[0][:8] if found else '- (none within %.0f s)' % wait_s}, "
                    f"its run is {run_id[:8]}")]


# ---- running them --------------------------------------------------------------------------------

def run(env: Env | None = None) -> list[Verdict]:
    env = env or Env()
    results: list[Verdict] = []
    cpu_checks = (("host", check_host), ("database", check_database), ("daemon round trip", check_daemon),
                  ("py-spy", check_pyspy))
    for name, check in cpu_checks:
        results += _guarded(env, name, lambda: check(env))
    try:
        collector = _collector(env)
    except Exception as e:  # NvmlUnavailable, or no nvidia-ml-py at all
        reason = str(e) or type(e).__name__
        return results + [Verdict(name, SKIPPED, reason) for name in (
            "NVML vs nvidia-smi", "sampling cost", "MIG", "CUDA checks")]
    try:
        results += _guarded(env, "NVML vs nvidia-smi", lambda: check_nvml(env, collector))
        results += _guarded(env, "sampling cost", lambda: check_sampling_cost(env, collector))
        results += _guarded(env, "MIG", lambda: check_mig(env, collector))
        results += _guarded(env, "CUDA checks (process, timing, allocator, profiler, OOM)",
                            lambda: _probe_checks(env, collector))
    finally:
        collector.close()
    return results


def _guarded(env: Env, name: str, check: Callable[[], list[Verdict]]) -> list[Verdict]:
    env.progress(f"selftest: {name} ...")
    started = time.monotonic()
    try:
        got = check()
    except Exception as e:  # a broken check is a FAIL with its reason, never a traceback
        got = [Verdict(name, FAIL, f"{type(e).__name__}: {e}")]
    env.progress(f"selftest: {name} done in {time.monotonic() - started:.1f} s")
    return got


def passed(results: list[Verdict]) -> bool:
    return all(r.status != FAIL for r in results)


def as_json(results: list[Verdict]) -> str:
    return json.dumps({"ok": passed(results), "checks": [asdict(r) for r in results]}, indent=1)
