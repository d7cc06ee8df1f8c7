"""The rules every notebook's plan (ddp_helpers/chapters/chNN_*/chNN_plan.py) keeps, on every machine shape the notebooks
must meet (tests/plan_rules.py): GPUs per node in {0, 1, 2, 4, 8} x ranks per node in {1, 2, 3, 8} x nodes in
{1, 2}, smoke and full size. Each notebook's own rules are in tests/chapters/chNN_*/test_chNN_plan.py.
No GPU here: the GPU shapes are tested by their plans, against the rules in plans/core.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_rules import (
    SHAPES,
    computes_where_planned,
    every_shape,
    for_each,
    placed,
    shape_name,
    sizes_by_kind,
)

from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, placement, plan_for, planners

NOTEBOOKS = list(planners())
NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
LESSONS = sorted(path.name[:2] for path in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_every_lesson_has_a_plan():
    assert NOTEBOOKS == LESSONS, f"plans for {NOTEBOOKS}, lessons {LESSONS}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_each_compared_group_computes_on_one_device_kind_the_first_on_the_plans(notebook):
    """Nothing is compared across device kinds; `plan.device`, which the notebook prints and branches on, is
    where its first compared group (where it compares none, its first run) computes."""

    def rule(plan: NotebookPlan) -> None:
        for group in plan.compared:
            kinds = {name: plan.runs[name].device for name in group}
            assert len(set(kinds.values())) == 1, kinds
        first = plan.compared[0] if plan.compared else list(plan.runs)[:1]
        assert {plan.runs[name].device for name in first} == {plan.device}, (plan.device, first)

    every_shape(notebook, rule)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_run_computes_where_the_launcher_puts_it_nccl_only_with_a_gpu_per_rank(notebook):
    def rule(plan: NotebookPlan) -> None:
        for run in plan.runs.values():
            computes_where_planned(plan.machine, run)

    every_shape(notebook, rule)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_sizes_are_chosen_by_device_kind_never_by_a_count(notebook):
    assert {kind for kind, _ in sizes_by_kind(notebook)} <= {"cpu", "cuda"}  # fails if a count changed them


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_run_fits_the_machine_and_its_global_batch_splits_over_its_world(notebook):
    def rule(plan: NotebookPlan) -> None:
        for name, run in plan.runs.items():
            assert run.world == run.nproc * run.nodes and run.devices >= 1, (name, run)
            assert run.nodes <= plan.machine.nodes, (name, run)
            if run.batch is not None:
                assert run.batch >= run.world and run.batch % run.world == 0, (name, run.batch, run.world)

    every_shape(notebook, rule)


def test_a_demo_gets_a_gpu_per_rank_where_the_machine_has_one_else_the_cpu_with_the_gpus_hidden():
    def rule(case: tuple[Machine, int]) -> None:
        machine, ranks = case
        placed(machine, placement(machine, ranks, nodes=machine.nodes), ranks, machine.nodes)

    for_each(((f"{shape_name(m)}, a demo of {n}", (m, n)) for m in SHAPES for n in (1, 2, 3, 8)), rule)


def test_a_machine_that_cannot_be_is_refused():
    with pytest.raises(ValueError, match="expected gpus >= 0, nproc >= 1 and nodes >= 1"):
        Machine(0, 2, 0)
    with pytest.raises(ValueError, match="no plan for notebook '99'"):
        plan_for("99", 0, 2)
