"""Every notebook's plan (ddp_helpers/kernel/lab/nbNN.py) over every machine shape the notebooks must meet:
GPUs per node in {0, 1, 2, 4, 8} x ranks per node in {1, 2, 3, 8} x nodes in {1, 2}, smoke and full size.
No GPU here: the GPU shapes are tested by their plans, against the rules in ddp_helpers/kernel/lab/plan_core.py."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from ddp_helpers.backends import resolve_backend
from ddp_helpers.kernel.lab.plans import Machine, NotebookPlan, RunPlan, placement, plan_for, planners

SHAPES = list(itertools.product((0, 1, 2, 4, 8), (1, 2, 3, 8), (1, 2)))
NOTEBOOKS = list(planners())


def visible_to(run: RunPlan, gpus: int) -> int:
    """GPUs each of the run's processes sees, after its env."""
    if "CUDA_VISIBLE_DEVICES" not in run.env:
        return gpus
    value = run.env["CUDA_VISIBLE_DEVICES"]
    return len(value.split(",")) if value else 0


def every_plan(notebook: str) -> list[NotebookPlan]:
    return [plan_for(notebook, g, n, nodes, smoke=smoke) for g, n, nodes in SHAPES for smoke in (False, True)]


def test_the_plans_are_found():
    assert "02" in NOTEBOOKS, NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_nothing_is_compared_across_device_kinds(notebook):
    for plan in every_plan(notebook):
        for group in plan.compared:
            kinds = {name: plan.runs[name].device for name in group}
            assert len(set(kinds.values())) == 1, f"{plan.machine}: {kinds}"  # each group on one kind


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_nccl_only_where_every_local_rank_has_its_own_gpu(notebook):
    for plan in every_plan(notebook):
        for name, run in plan.runs.items():
            seen = visible_to(run, plan.machine.gpus)
            backend, device = resolve_backend(run.backend, seen)
            assert device == run.device, f"{plan.machine} {name}: the launcher puts it on {device}: {run}"
            if backend == "nccl":
                assert run.nproc <= seen, (
                    f"{plan.machine} {name}: nccl with {run.nproc} ranks and {seen} GPUs"
                )
            if run.device == "cpu":
                assert seen == 0 or run.backend == "gloo", f"{plan.machine} {name}: {run}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_sizes_are_chosen_by_device_kind(notebook):
    """Within one device kind (and smoke or not), every machine gets the same sizes: never by a count."""
    seen: dict[tuple[str, bool], set[str]] = defaultdict(set)
    for g, n, nodes in SHAPES:
        for smoke in (False, True):
            plan = plan_for(notebook, g, n, nodes, smoke=smoke)
            seen[(plan.device, smoke)].add(repr(sorted(plan.sizes.items())))
    assert all(len(sizes) == 1 for sizes in seen.values()), dict(seen)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_run_fits_the_world_it_is_given(notebook):
    for plan in every_plan(notebook):
        for name, run in plan.runs.items():
            assert run.nodes <= plan.machine.nodes, f"{plan.machine} {name}: {run}"
            if run.batch is not None:
                assert run.batch >= run.world and run.batch % run.world == 0, (
                    f"{plan.machine} {name}: a global batch of {run.batch} over {run.world} ranks"
                )


@pytest.mark.parametrize(
    ("gpus", "ranks", "device", "backend"),
    [(0, 2, "cpu", "auto"), (1, 2, "cpu", "gloo"), (2, 2, "cuda", "auto")],
)
def test_a_demo_that_needs_more_ranks_than_gpus_goes_to_the_cpu_with_the_gpus_hidden(
    gpus, ranks, device, backend
):
    run = placement(Machine(gpus, 8), ranks)
    assert (run.device, run.backend, run.nproc) == (device, backend, ranks)
    assert visible_to(run, gpus) == (gpus if device == "cuda" else 0)


def test_a_machine_that_cannot_be_is_refused():
    with pytest.raises(ValueError, match="expected gpus >= 0, nproc >= 1 and nodes >= 1"):
        Machine(0, 2, 0)
    with pytest.raises(ValueError, match="no plan for notebook '99'"):
        plan_for("99", 0, 2)
