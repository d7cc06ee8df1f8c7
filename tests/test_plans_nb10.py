"""Notebook 10's plan: the capstone check's world sizes, and hidden GPUs where a size has too few."""

from __future__ import annotations

from ddp_helpers.chapters.ch10_capstone import ch10_plan as nb10
from ddp_helpers.kernel.lab.plans import Machine, plan_for


def test_two_then_three_ranks_and_two_only_in_smoke():
    assert plan_for("10", 0, 2).sizes["worlds"] == (2, 3)
    assert plan_for("10", 0, 2, smoke=True).sizes["worlds"] == (2,)
    assert nb10.plan(Machine(0, 4), False, worlds=(4,)).sizes["worlds"] == (4,)


def test_two_gpus_check_two_ranks_on_nccl_and_three_on_the_cpu_with_the_gpus_hidden():
    runs = plan_for("10", 2, 2).runs
    assert (runs["check-2"].device, runs["check-2"].env) == ("cuda", {})
    assert (runs["check-3"].device, runs["check-3"].backend) == ("cpu", "gloo")
    assert runs["check-3"].env == {"CUDA_VISIBLE_DEVICES": ""}
