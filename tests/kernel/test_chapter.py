"""Every chapter's one setup call: the ranks, the plan and the workers its launches use."""

from __future__ import annotations

import pytest

from ddp_helpers.kernel.lab.chapter import chapter_setup
from ddp_helpers.kernel.lab.plan_core import plan_for
from ddp_helpers.kernel.launcher.machine import visible_gpus


def test_the_parameter_wins_else_one_rank_per_gpu_else_two(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert chapter_setup("04", 3).nproc == 3
    gpus = visible_gpus()
    chapter = chapter_setup("04", None, smoke=True)
    assert (chapter.gpus, chapter.nproc) == (gpus, gpus or 2)
    assert chapter.plan == plan_for("04", gpus, gpus or 2, smoke=True)  # the plan of the ranks chosen
    assert chapter.workers == {}


def test_its_workers_go_into_the_notebooks_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    chapter = chapter_setup("02", 2, smoke=True, workers=["train"])
    assert chapter.workers["train"].resolve() == (tmp_path / "runs/workers/02/train.py").resolve()
    assert "def main" in chapter.workers["train"].read_text()
    # another notebook's copy is its own: an edit to one never reaches the other's run
    other = chapter_setup("03", 2, smoke=True, workers=["train"]).workers["train"]
    other.write_text(other.read_text() + "\n# edited in notebook 03\n")
    assert "edited in notebook 03" not in chapter.workers["train"].read_text()


def test_options_reach_the_notebooks_planner():
    assert chapter_setup("10", 2, smoke=False, worlds=(3,)).plan.sizes["worlds"] == (3,)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_nproc_is_refused_with_what_was_given(bad):
    with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
        chapter_setup("04", bad)


def test_loopback_nodes_share_the_gpus():
    chapter = chapter_setup("06", 1, smoke=True, nodes=2)
    assert chapter.gpus == visible_gpus() // 2 and chapter.plan.machine.nodes == 2


def test_an_unknown_notebook_is_refused():
    with pytest.raises(ValueError, match="no plan for notebook '42'"):
        chapter_setup("42", 2)
