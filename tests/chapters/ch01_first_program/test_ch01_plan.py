"""Notebook 01's plan: ddp.py on the ranks asked for, the single-device script on ddp.py's device kind, the
live ranks two at least."""

from __future__ import annotations

from plan_rules import at_least_two, every_shape, placed, says_why_it_runs_more

from ddp_helpers.kernel.lab.plan_core import NotebookPlan


def test_ddp_py_runs_the_ranks_asked_for_and_the_live_ranks_two_at_least_and_the_line_says_why():
    """The live ranks need a second rank to exchange anything with."""

    def rule(plan: NotebookPlan) -> None:
        placed(plan.machine, plan.runs["whole"], plan.machine.nproc)
        placed(plan.machine, plan.runs["live"], at_least_two(plan.machine))
        says_why_it_runs_more(plan, plan.runs["live"])

    every_shape("01", rule)


def test_the_single_device_script_is_one_process_where_ddp_py_runs():
    """Their losses are compared: on ddp.py's device kind, with the GPUs hidden from both where ddp.py hides them."""

    def rule(plan: NotebookPlan) -> None:
        single, whole = plan.runs["single"], plan.runs["whole"]
        assert (single.nproc, single.devices, single.nodes) == (1, 1, 1), single
        where = (single.device, single.backend, single.env)
        assert where == (whole.device, whole.backend, whole.env), plan.runs
        assert ("single", "whole") in plan.compared, plan.compared

    every_shape("01", rule)
