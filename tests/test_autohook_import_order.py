"""`gpuwatch run` hooks torch however the program reaches it: find_spec first (transformers,
datasets, evaluate), importlib.import_module, a library importing it, a multiprocessing spawn child."""

from __future__ import annotations

import pytest
from test_autoinstrument import PY, SCRIPTS, gw_run, query

pytest.importorskip("torch")


@pytest.mark.parametrize("how", ["find_spec", "import_module", "transformers", "spawn"])
def test_torch_is_hooked_whatever_the_import_order(how):
    done = gw_run(PY, str(SCRIPTS / "import_order.py"), how)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(s["step"], s["tokens"]) for s in query("SELECT * FROM steps ORDER BY step")] == [
        (1, 16),
        (2, 16),
        (3, 16),
    ]
