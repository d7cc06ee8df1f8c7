"""Notebook 04's plan: the resumes where the reference runs, the demos where ranks disagree or fail on two ranks
at least, and the two one-off gloo jobs."""

from __future__ import annotations

from plan_rules import at_least_two, every_shape, placed, says_why_it_runs_more

from ddp_helpers.kernel.lab.plan_core import NotebookPlan

DEMOS = ("choose", "elastic", "elastic-reference", "exercise")  # a second rank, to disagree with or to fail


def test_the_reference_runs_the_ranks_asked_for_and_the_demos_two_at_least_and_the_line_says_why():
    def rule(plan: NotebookPlan) -> None:
        placed(plan.machine, plan.runs["train"], plan.machine.nproc)
        for name in DEMOS:
            placed(plan.machine, plan.runs[name], at_least_two(plan.machine))
        says_why_it_runs_more(plan, plan.runs["choose"])

    every_shape("04", rule)


def test_the_elastic_run_is_compared_with_a_run_of_its_own_shape_the_reference_where_the_shapes_match():
    def rule(plan: NotebookPlan) -> None:
        elastic, train = plan.runs["elastic"], plan.runs["train"]
        assert plan.runs["elastic-reference"] == elastic and ("elastic", "elastic-reference") in plan.compared
        assert (elastic == train) == (plan.machine.nproc >= 2), (elastic, train)

    every_shape("04", rule)


def test_the_killed_save_is_one_gloo_process_and_the_sum_order_three_gloo_ranks_on_every_machine():
    """Only rank 0 writes, so one process; three ranks are the fewest whose sum depends on the order."""

    def rule(plan: NotebookPlan) -> None:
        for name, ranks in (("crash", 1), ("sum-order", 3)):
            run = plan.runs[name]
            assert (run.nproc, run.nodes, run.backend, run.device) == (ranks, 1, "gloo", "cpu"), (name, run)

    every_shape("04", rule)
