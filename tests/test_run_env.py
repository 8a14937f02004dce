"""`gpuwatch run` with a Python that is not gpuwatch's own: a second venv with torch but without
gpuwatch (nor psutil, click, textual), the way a user's own env sits beside an admin's install."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from systools import NO_GPU_LINE

from gpuwatch.base import paths

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
OURS_AND_GPUWATCHS_DEPS = (
    "gpuwatch",
    "collectors",
    "__editable__",
    "psutil",
    "pynvml",
    "click",
    "textual",
    "_pytest",
    "pytest",
)
TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
for step in range(7):
    x = torch.randint(0, 32, (4, 8))
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, 32), x.view(-1))
    loss.backward()
    with torch.no_grad():  # updated by hand: torch.optim's first use imports dynamo (~1 CPU-s a program)
        for p in model.parameters():
            p -= 0.1 * p.grad
print("done 7 steps")
"""


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory) -> str:
    """A venv whose site-packages links every package of ours except gpuwatch and its own deps."""
    root = tmp_path_factory.mktemp("foreign")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = str(root / "venv" / "bin" / "python")
    shared = Path(sysconfig.get_paths()["purelib"])
    lib = root / "lib"
    lib.mkdir()
    for entry in shared.iterdir():
        if not entry.name.startswith(OURS_AND_GPUWATCHS_DEPS) and entry.suffix != ".pth":
            (lib / entry.name).symlink_to(entry)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "torch_from_elsewhere.pth").write_text(f"{lib}\n")
    return python


def _env() -> dict:
    """The test's environment without our worktree on PYTHONPATH: the child must not find us."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _gpuwatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Our CLI, from this checkout, in our interpreter; the child gets only what `run` gives it."""
    launcher = f"import sys; sys.path.insert(0, {str(REPO)!r}); from gpuwatch.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", launcher, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd="/",
    )


def _db(sql: str, *params) -> list:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_the_foreign_python_has_torch_but_not_gpuwatch_or_its_deps(foreign_python):
    probe = (
        "import torch\nfor m in ('gpuwatch', 'psutil', 'click'):\n    try:\n        __import__(m)\n"
        "        print('found', m)\n    except ImportError:\n        pass\n"
    )
    done = subprocess.run([foreign_python, "-c", probe], capture_output=True, text=True, env=_env(), cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_a_script_in_a_venv_without_gpuwatch_has_every_step_recorded(foreign_python, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = _gpuwatch("run", "--", foreign_python, str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done 7 steps\n"
    assert [
        line
        for line in done.stderr.splitlines()
        if line.startswith("gpuwatch:") and not line.startswith(NO_GPU_LINE)
    ] == []
    ((run_id, status),) = _db("SELECT run_id, status FROM runs")
    assert status == "finished"
    steps = _db("SELECT step, tokens, loss FROM steps WHERE run_id = ? ORDER BY step", run_id)
    assert [s[0] for s in steps] == list(range(1, 8))
    assert [tokens for _, tokens, _ in steps] == [32] * 7
    assert all(loss is not None and loss > 0 for _, _, loss in steps)


def test_a_child_that_cannot_load_gpuwatch_says_so_once_and_show_says_not_instrumented(tmp_path):
    # A stand-in for a too-old or broken interpreter: its `gpuwatch` is a package that fails
    # to import, first on its path (as an incompatible bytecode or syntax would).
    broken = tmp_path / "shadow" / "gpuwatch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('built for another Python')\n")
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(broken.parent)!r})\n" + TRAIN)
    done = _gpuwatch("run", "--", sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    lines = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("gpuwatch:") and not line.startswith(NO_GPU_LINE)
    ]
    assert len(lines) == 1 and "not instrumented" in lines[0] and "pip install gpuwatch" in lines[0]
    ((run_id,),) = _db("SELECT run_id FROM runs")
    shown = _gpuwatch("show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "not instrumented: gpuwatch could not load" in shown.stdout


def test_the_child_inherits_the_open_files_limit_it_would_have_had(tmp_path):
    # `gpuwatch run` serves the child's events itself with the daemon's ingest, which raises its
    # own open-files limit: the child must still start with the user's.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(soft, 256)
    script = tmp_path / "limit.py"
    script.write_text("import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    launcher = f"import sys; sys.path.insert(0, {str(REPO)!r}); from gpuwatch.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", launcher, "run", "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{lower}\n"


def test_what_a_child_loads_is_python_3_10_syntax_and_the_bootstrap_loads_on_older_ones():
    # No second interpreter version here to run: the parser's feature_version catches newer
    # syntax (except*, PEP 695 generics, ...) in anything a 3.10 child would import, and keeps
    # the bootstrap loadable on an older Python, so it can say why it is not instrumenting.
    import ast

    for path in [*(REPO / "gpuwatch").rglob("*.py"), *(REPO / "collectors").rglob("*.py")]:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))
    bootstrap = REPO / "gpuwatch" / "integrations" / "bootstrap" / "sitecustomize.py"
    ast.parse(bootstrap.read_text(), feature_version=(3, 7))
