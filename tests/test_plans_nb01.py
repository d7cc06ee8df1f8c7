"""Notebook 01's plan: the single-device script on ddp.py's device kind; the live ranks at least two."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for


def test_the_single_script_runs_where_ddp_py_runs():
    for gpus, nproc in ((0, 2), (1, 2), (2, 2), (1, 1)):
        plan = plan_for("01", gpus, nproc)
        single, whole = plan.runs["single"], plan.runs["whole"]
        assert (single.nproc, single.device, single.env) == (1, whole.device, whole.env), plan.runs
    assert plan_for("01", 1, 2).runs["single"].env == {"CUDA_VISIBLE_DEVICES": ""}  # ddp.py on gloo: CPU too


def test_one_rank_gets_two_live_ranks_and_the_line_says_where():
    plan = plan_for("01", 1, 1)
    assert (plan.runs["whole"].nproc, plan.runs["whole"].device) == (1, "cuda")
    assert (plan.runs["live"].nproc, plan.runs["live"].backend) == (2, "gloo")
    assert "The live ranks need two: This demo needs 2 ranks" in plan.line, plan.line
