"""The import directory `gpuwatch run` puts first on a Python child's PYTHONPATH.

The child's interpreter is often not ours (the user's own venv or conda env, another Python
minor version). It gets a private directory holding only our bootstrap `sitecustomize` and our
own two packages (`gpuwatch`, `collectors`), linked, never copied: nothing of the environment
gpuwatch is installed in (psutil, click, textual, ...) can shadow the child's packages. What
the child runs of ours is the pure-stdlib client: it sends its events over a Unix socket (the
daemon's, or the one `gpuwatch run` serves itself), so it never needs psutil or NVML.
"""

from __future__ import annotations

import os
from pathlib import Path

import collectors
import gpuwatch
from gpuwatch.integrations import BOOTSTRAP_DIR, ENV_INSTRUMENT

# Set in the child's environment: where the bootstrap leaves one line when it cannot
# instrument this interpreter (too old a Python, our package failing to load in it).
ENV_NOTE = "GPUWATCH_BOOTSTRAP_NOTE"


def make(directory: Path) -> Path:
    """Make `directory` (inside a private one) hold the child's import path; return it."""
    directory.mkdir(mode=0o700)
    links = {
        "sitecustomize.py": os.path.join(BOOTSTRAP_DIR, "sitecustomize.py"),
        "gpuwatch": os.path.dirname(os.path.abspath(gpuwatch.__file__)),
        "collectors": os.path.dirname(os.path.abspath(collectors.__file__)),
    }
    for name, target in links.items():
        os.symlink(target, directory / name)
    return directory


def prepare(env: dict[str, str], private: Path, note: Path, instrument: bool) -> None:
    """Ready a child's environment `env` in place: with `instrument`, our bootstrap first on its
    import path and `note` where it leaves its one line if it cannot run; without, our hooks are
    told to stay off (the child may still import gpuwatch itself)."""
    if instrument:
        path = make(private / "path")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
        env[ENV_NOTE] = str(note)
    else:
        env[ENV_INSTRUMENT] = "0"
