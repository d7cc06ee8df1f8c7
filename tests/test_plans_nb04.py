"""Notebook 04's plan: the resumes where the reference runs, the two-rank demos on gloo where GPUs are few."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for


def test_one_gpu_one_rank_keeps_the_reference_on_the_gpu_and_the_demos_on_two_gloo_ranks():
    plan = plan_for("04", 1, 1)
    assert (plan.runs["train"].device, plan.runs["train"].nproc) == ("cuda", 1)
    for name in ("choose", "elastic", "exercise"):
        run = plan.runs[name]
        assert (run.nproc, run.device, run.backend, run.env) == (
            2,
            "cpu",
            "gloo",
            {"CUDA_VISIBLE_DEVICES": ""},
        )
    assert "need two ranks" in plan.line and "2 gloo ranks on the CPU" in plan.line, plan.line
    assert plan.runs["elastic"] != plan.runs["train"]  # so the notebook runs an elastic-reference of its own


def test_where_the_shapes_match_the_elastic_run_is_the_reference_s():
    plan = plan_for("04", 0, 2)
    assert plan.runs["elastic"] == plan.runs["train"], plan.runs
    assert "need two ranks" not in plan.line
