"""The mutant runner (mutants/run.py): the catalogue is well formed, every mutant still applies to today's
tree exactly once, and the runner refuses what would prove nothing. `make mutants` runs the notebooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures import load_script

ROOT = Path(__file__).resolve().parent.parent
runner = load_script("mutant_runner", ROOT / "mutants" / "run.py")

ENTRY = """
[[mutant]]
name = "{name}"
notebook = "{notebook}"
lesson = "a lesson"
file = "{file}"
old = "{old}"
new = "{new}"
"""


def _catalogue(tmp_path: Path, *entries: str) -> Path:
    folder = tmp_path / "catalogue"
    folder.mkdir(exist_ok=True)
    (folder / "t.toml").write_text("".join(entries))
    return folder


def _entry(**fields: str) -> str:
    base = {"name": "m", "notebook": "00", "file": "x.py", "old": "a", "new": "b"}
    return ENTRY.format(**(base | fields))


# ------------------------------------------------------------------------------------ today's catalogue
def test_the_catalogue_is_big_enough_and_covers_every_notebook():
    mutants = runner.load_catalogue()
    assert len(mutants) >= 40, f"expected at least 40 mutants, found {len(mutants)}"
    per_notebook = {stem: sum(m.notebook == stem for m in mutants) for stem in runner.notebook_stems()}
    # a lesson carries its main bugs; a companion (deeper/) at least the two that its own checks guard
    thin = {stem: n for stem, n in per_notebook.items() if n < (2 if stem.startswith("deeper/") else 3)}
    assert not thin, (
        f"expected at least 3 mutants for every lesson, 2 for a companion; these have fewer: {thin}"
    )


@pytest.mark.parametrize("mutant", runner.load_catalogue(), ids=lambda m: m.name)
def test_every_mutant_applies_once_to_todays_tree(mutant, tmp_path):
    """A mutant whose text has moved would run the notebook unchanged: it must fail here, not survive there."""
    target = tmp_path / mutant.file
    target.parent.mkdir(parents=True)
    target.write_bytes((ROOT / mutant.file).read_bytes())
    runner.apply(mutant, tmp_path)
    assert target.read_bytes() != (ROOT / mutant.file).read_bytes()


def test_cpu_unkillable_mutants_say_why_and_are_left_to_the_gpu_check():
    mutants = runner.load_catalogue()
    for m in mutants:
        if m.cpu_unkillable:
            assert len(m.cpu_unkillable) > 20, f"{m.name}: say why a CPU cannot kill it, and what would"
    assert all(m.cpu_unkillable for m in runner.select(mutants, [], gpu=True))
    assert not any(m.cpu_unkillable for m in runner.select(mutants, [], gpu=False))


# ------------------------------------------------------------------------------------ what it refuses
def test_a_repeated_name_is_refused(tmp_path):
    folder = _catalogue(tmp_path, _entry(), _entry())
    with pytest.raises(runner.CatalogueError, match="unique"):
        runner.load_catalogue(folder)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_entry(notebook="99"), "names none"),
        (_entry(old="same", new="same"), "the same text"),
        (_entry().replace('new = "b"', 'new = "b"\nnpoc = [2]'), "unknown fields"),
        (_entry().replace('lesson = "a lesson"\n', ""), "missing"),
        (_entry() + "nproc = [0]\n", "positive"),
    ],
)
def test_a_malformed_entry_is_refused(tmp_path, entry, message):
    with pytest.raises(runner.CatalogueError, match=message):
        runner.load_catalogue(_catalogue(tmp_path, entry))


def _mutant(**fields):  # -> runner.Mutant (a module loaded at run time: no type mypy can name)
    base = dict(name="m", notebook="00_x", lesson="l", file="w.py", old="x = 1\n", new="x = 2\n")
    return runner.Mutant(**(base | fields))


@pytest.mark.parametrize("text", ["y = 0\n", "x = 1\nx = 1\n"], ids=["absent", "twice"])
def test_an_edit_must_match_exactly_once(tmp_path, text):
    (tmp_path / "w.py").write_text(text)
    with pytest.raises(runner.CatalogueError, match="not once"):
        runner.apply(_mutant(), tmp_path)


def test_an_edit_that_breaks_the_syntax_is_refused(tmp_path):
    (tmp_path / "w.py").write_text("if True:\n    x = 1\n")
    with pytest.raises(runner.CatalogueError, match="unparsable"):
        runner.apply(_mutant(old="    x = 1\n", new="x = 1\n"), tmp_path)


def _notebook(tmp_path: Path, *sources: str) -> Path:
    cells: list[dict[str, object]] = [
        {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
        for s in sources
    ]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_notebook_edit_lands_in_the_one_cell_that_holds_it(tmp_path):
    _notebook(tmp_path, "a = 1\n", "%%ranks\nb = 2\nassert b == 2\n")
    runner.apply(_mutant(file="n.ipynb", old="b = 2", new="b = 3"), tmp_path)
    cells = json.loads((tmp_path / "n.ipynb").read_text())["cells"]
    assert "".join(cells[1]["source"]) == "%%ranks\nb = 3\nassert b == 2\n"
    assert "".join(cells[0]["source"]) == "a = 1\n"


def test_a_notebook_edit_in_two_cells_is_refused(tmp_path):
    _notebook(tmp_path, "a = 1\n", "a = 1\n")
    with pytest.raises(runner.CatalogueError, match="once in one cell"):
        runner.apply(_mutant(file="n.ipynb", old="a = 1", new="a = 2"), tmp_path)


# ------------------------------------------------------------------------------------ what it reports
def test_the_failing_cell_is_numbered_as_in_the_stored_notebook(tmp_path):
    executed = tmp_path / "e.ipynb"
    banner = {"cell_type": "markdown", "metadata": {"tags": ["papermill-error-cell-tag"]}, "source": ""}
    injected = {
        "cell_type": "code",
        "metadata": {"tags": ["injected-parameters"]},
        "source": "",
        "outputs": [],
    }
    failed = {
        "cell_type": "code",
        "metadata": {},
        "source": "assert False",
        "outputs": [{"output_type": "error", "ename": "AssertionError", "evalue": "\x1b[0;31mexpected 3"}],
    }
    plain = {"cell_type": "code", "metadata": {}, "source": "", "outputs": []}
    executed.write_text(json.dumps({"cells": [banner, plain, injected, plain, banner, failed]}))
    assert runner._first_error(executed, "") == (2, "AssertionError: expected 3")


def test_the_copy_holds_what_a_clone_holds_and_nothing_ignored(tmp_path):
    files = runner.project_files()
    assert "mutants/run.py" in files and "Makefile" in files
    assert not any(f.startswith((".venv", "runs/")) for f in files)


def test_only_a_kill_counts_as_guarded():
    mutant = _mutant()
    assert runner.Outcome(mutant, 2, "killed").ok
    for status in ("survived", "invalid", "timeout"):
        assert not runner.Outcome(mutant, 2, status).ok, status


def test_a_run_that_would_run_no_mutant_is_refused(tmp_path, capsys):
    catalogue = _catalogue(tmp_path, _entry())  # not marked ci = true
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--ci", "--catalogue", str(catalogue), "--report", str(tmp_path / "report")])
    assert exit_info.value.code == 2
    assert "none is marked ci = true" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


def test_the_ci_subset_guards_every_notebook_twice():
    """CI runs only the ci = true entries: each notebook's main lessons must still be among them."""
    chosen = runner.select(runner.load_catalogue(), [], gpu=False, ci=True)
    per_notebook = {stem: sum(m.notebook == stem for m in chosen) for stem in runner.notebook_stems()}
    # a companion's one: CI runs each ci mutant's notebook whole, and time is CI's scarcest resource
    thin = {stem: n for stem, n in per_notebook.items() if n < (1 if stem.startswith("deeper/") else 2)}
    assert not thin, (
        f"mark at least 2 mutants ci = true for every lesson, 1 for a companion; these have fewer: {thin}"
    )


def test_only_with_a_notebook_and_a_name_runs_that_one_mutant():
    mutants = runner.load_catalogue()
    first = next(m for m in mutants if not m.cpu_unkillable)
    number = first.notebook[:2]
    assert runner.select(mutants, [number, first.name], gpu=False) == [first]
    assert runner.select(mutants, [first.name], gpu=False) == [first]
    of_notebook = runner.select(mutants, [number], gpu=False)
    assert first in of_notebook and all(m.notebook.startswith(number) for m in of_notebook)
