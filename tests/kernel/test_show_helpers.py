"""The package modules a worker needs, read from its imports."""

from __future__ import annotations

from ddp_helpers.kernel.lab.source_view import _resolve, module_path, package_imports, purpose, show_helpers


def test_ddp_py_needs_nothing_and_train_py_names_its_helpers():
    assert package_imports(_resolve("ddp")) == {}  # notebook 01's script: torch only
    helpers = package_imports(_resolve("train"))
    assert "Reporter" in helpers["ddp_helpers.workers.train_report"]
    assert helpers["ddp_helpers.rank.teardown"] == ()  # `from ddp_helpers.rank import teardown`
    assert all(purpose(module_path(m)).endswith(".") and len(purpose(module_path(m))) > 20 for m in helpers)


def test_only_top_level_absolute_imports_count(tmp_path):
    source = tmp_path / "worker.py"
    source.write_text(
        "import ddp_helpers.rank.metrics\n"
        "from ddp_helpers.rank.data import digits, build_dataset\n"
        "from ddp_helpers.rank import teardown\n"
        "def main():\n    from ddp_helpers.rank import checkpoint\n"
        "from . import sibling\n"  # relative: no package to resolve it in a copied-out file
    )
    assert package_imports(source) == {
        "ddp_helpers.rank.data": ("digits", "build_dataset"),
        "ddp_helpers.rank.metrics": (),
        "ddp_helpers.rank.teardown": (),
    }


def test_purpose_is_the_docstrings_first_sentence_joined(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Does one thing, across\ntwo lines. Then more.\n\nDetails."""\n')
    assert purpose(module) == "Does one thing, across two lines."


def test_show_helpers_prints_the_table_outside_ipython(capsys):
    shown = show_helpers("train")
    out = capsys.readouterr().out
    assert f"`train.py` imports {len(shown)} module(s) of `ddp_helpers`" in out
    assert "| `ddp_helpers.workers.train_report` |" in out
