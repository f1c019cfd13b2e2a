"""Every example notebook executes headlessly on the embedded default, and matches its script twin."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from oospec_testing import DATA

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
from sync_notebooks import TWINS, notebook  # noqa: E402


@pytest.mark.parametrize("name", TWINS)
def test_notebook_is_built_from_its_script(name):
    committed = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    built = notebook((EXAMPLES / f"{name}.py").read_text())
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells], \
        "the notebook is stale: run `python examples/sync_notebooks.py`"


@pytest.mark.slow
@pytest.mark.parametrize("name", TWINS)
def test_notebook_executes(name, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    # The kernel inherits this environment: a small benchmark, the shared data, outputs in tmp_path.
    monkeypatch.setenv("OOSPEC_DATA", str(DATA / "dev.jsonl"))
    monkeypatch.setenv("BENCH_LIMIT", "1")
    monkeypatch.setenv("BENCH_MAX_NEW_TOKENS", "12")
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    if name == "benchmark":
        assert any("image/png" in o.get("data", {}) for o in outputs)
        assert (tmp_path / "bench-out" / "results.json").exists()
