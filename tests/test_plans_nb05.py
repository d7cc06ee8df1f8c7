"""Notebook 05's plan: every pitfall on at least two ranks; the out-of-memory demo only on a GPU."""

from __future__ import annotations

from ddp_helpers.kernel.lab.plans import plan_for


def test_one_rank_asked_still_runs_two_and_says_why():
    plan = plan_for("05", 0, 1)
    assert plan.runs["pitfalls"].nproc == plan.runs["live"].nproc == 2
    assert plan.line.startswith("nproc = 1, but every pitfall here needs two ranks: the demos run 2.")


def test_one_gpu_runs_the_pitfalls_on_gloo_with_the_gpu_hidden_and_the_oom_on_the_gpu():
    plan = plan_for("05", 1, 1)
    demos = plan.runs["pitfalls"]
    assert (demos.device, demos.backend, demos.env) == ("cpu", "gloo", {"CUDA_VISIBLE_DEVICES": ""})
    assert (plan.runs["oom"].device, plan.runs["oom"].nproc) == ("cuda", 1)
    assert "oom" not in plan_for("05", 0, 2).runs  # a CPU runs out of memory through the OOM killer


def test_eight_gpus_run_the_pitfalls_on_nccl():
    demos = plan_for("05", 8, 8).runs["pitfalls"]
    assert (demos.device, demos.backend, demos.nproc) == ("cuda", "auto", 8)
