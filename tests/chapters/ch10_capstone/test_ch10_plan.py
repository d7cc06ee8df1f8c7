"""Notebook 10's plan: the capstone check's world sizes, each on a GPU per rank or on the CPU with the GPUs
hidden."""

from __future__ import annotations

from plan_rules import SHAPES, every_shape, placed

from ddp_helpers.kernel.lab.plan_core import NotebookPlan, plan_for


def worlds(plan: NotebookPlan) -> tuple[int, ...]:
    return tuple(plan.sizes["worlds"])


def test_each_world_size_is_a_check_on_that_many_ranks_and_the_line_names_them_in_order():
    def rule(plan: NotebookPlan) -> None:
        assert list(plan.runs) == [f"check-{n}" for n in worlds(plan)], list(plan.runs)
        for n in worlds(plan):
            placed(plan.machine, plan.runs[f"check-{n}"], n)
        assert f"checked at {' and then '.join(map(str, worlds(plan)))} rank(s)" in plan.line, plan.line

    every_shape("10", rule)
    every_shape("10", rule, worlds=(4,))  # the notebook's nproc: that size instead


def test_the_check_runs_two_ranks_then_an_odd_world_and_smoke_mode_only_the_first():
    """An odd world is where the all-reduce's order shows; smoke mode (CI) checks fewer."""
    for m in SHAPES:
        full, smoke = (worlds(plan_for("10", m.gpus, m.nproc, m.nodes, smoke=s)) for s in (False, True))
        assert full[0] == 2 and any(n % 2 for n in full), full
        assert full[: len(smoke)] == smoke and len(smoke) < len(full), (full, smoke)
        assert worlds(plan_for("10", m.gpus, m.nproc, m.nodes, worlds=(4,))) == (4,)
