"""Every notebook runs headless under papermill in smoke mode, and is stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(notebook):
    nb = nbformat.read(notebook, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "smoke = False" in tagged[0].source


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_HELPERS_PROGRESS", "text")  # papermill stores text, not widget state
    monkeypatch.chdir(tmp_path)  # the notebook's runs/ folder lands here, not in the repo
    papermill.execute_notebook(
        str(notebook),
        str(tmp_path / notebook.name),
        parameters={"smoke": True},
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
        execution_timeout=600,
    )
