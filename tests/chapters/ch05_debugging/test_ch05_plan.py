"""Notebook 05's plan: every pitfall on two ranks at least; the out-of-memory demo only on a GPU."""

from __future__ import annotations

from plan_rules import at_least_two, every_shape, placed, says_why_it_runs_more

from ddp_helpers.kernel.lab.plan_core import NotebookPlan


def test_every_pitfall_runs_the_ranks_asked_for_or_two_and_the_line_says_why():
    """A pitfall needs a second rank to disagree with."""

    def rule(plan: NotebookPlan) -> None:
        for name in ("pitfalls", "live"):
            placed(plan.machine, plan.runs[name], at_least_two(plan.machine))
        says_why_it_runs_more(plan, plan.runs["pitfalls"])

    every_shape("05", rule)


def test_the_out_of_memory_demo_is_one_rank_on_a_gpu_where_there_is_one_and_absent_on_the_cpu():
    """A CPU runs out of memory through the kernel's OOM killer."""

    def rule(plan: NotebookPlan) -> None:
        assert ("oom" in plan.runs) == (plan.machine.gpus > 0), list(plan.runs)
        if plan.machine.gpus:
            oom = plan.runs["oom"]
            assert (oom.nproc, oom.nodes, oom.device, oom.backend) == (1, 1, "cuda", "auto"), oom

    every_shape("05", rule)
