"""Notebook 02's throughput runs (ddp_helpers/chapters/ch02_single_dp_ddp/ch02_plan.py) on every one-node shape the notebooks
must run on (tests/plan_rules.py): GPUs in {0, 1, 2, 4, 8} x nproc in {1, 2, 3, 8}, smoke and full size.
No GPU here: the GPU shapes are tested by their plans."""

from __future__ import annotations

import pytest
from plan_rules import ONE_NODE, computes_where_planned, for_each, shape_name, visible_to

from ddp_helpers.chapters.ch02_single_dp_ddp.ch02_plan import ThroughputPlan, sweep_points, throughput_plan
from ddp_helpers.kernel.lab.plan_core import Machine

Case = tuple[Machine, ThroughputPlan]
RUNS_ON = [(m, smoke) for m in ONE_NODE for smoke in (False, True)]
CASES = [(shape_name(m, smoke), (m, throughput_plan(m.gpus, m.nproc, smoke))) for m, smoke in RUNS_ON]


def visible_ids(run, gpus: int) -> list[str]:
    """The GPU ids the run's processes see, after its env."""
    value = run.env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus))))
    return value.split(",") if value else []


def test_every_run_on_one_device_kind_gpus_where_every_ddp_rank_has_its_own():
    def rule(case: Case) -> None:
        machine, plan = case
        assert {run.device for run in plan.runs()} == {plan.device}, plan
        assert plan.device == ("cuda" if machine.gpus >= machine.nproc else "cpu"), plan.device
        says_why = "NCCL needs one GPU per rank" in plan.line
        assert says_why == (0 < machine.gpus < machine.nproc), plan.line  # GPUs left idle: why

    for_each(CASES, rule)


def test_each_run_computes_where_the_launcher_puts_it_and_a_cpu_run_sees_no_gpu_and_uses_one_core():
    def rule(case: Case) -> None:
        machine, plan = case
        for run in plan.runs():
            computes_where_planned(machine, run)
            if run.device == "cpu":  # DataParallel would reach for any GPU it sees
                assert visible_to(run, machine.gpus) == 0, run
                assert run.env.get("OMP_NUM_THREADS") == "1", run  # a CPU device is one core

    for_each(CASES, rule)


def test_dataparallel_splits_over_the_gpus_ddp_uses_and_none_on_the_cpu():
    def rule(case: Case) -> None:
        machine, plan = case
        if plan.device == "cuda":  # DDP's rank r computes on cuda:r
            assert visible_ids(plan.dp, machine.gpus) == [str(r) for r in range(machine.nproc)], plan.dp
            assert plan.dp.nproc == 1 and plan.dp.devices == plan.ddp.devices == machine.nproc, plan
        else:
            assert visible_ids(plan.dp, machine.gpus) == [] and plan.dp.devices == 1, plan.dp

    for_each(CASES, rule)


def test_the_sweep_runs_from_the_single_process_to_ddp_by_powers_of_two():
    def rule(case: Case) -> None:
        machine, plan = case
        assert list(plan.sweep) == sweep_points(machine.nproc)
        assert plan.sweep[1] == plan.single and plan.sweep[machine.nproc] == plan.ddp
        powers = {2**k for k in range(machine.nproc.bit_length()) if 2**k <= machine.nproc}
        assert set(plan.sweep) == powers | {machine.nproc}, list(plan.sweep)  # 1, 2, 4, ... and nproc
        assert all(plan.sweep[n].nproc == plan.sweep[n].devices == n for n in plan.sweep), plan.sweep
        assert plan.single.nproc == 1 and plan.ddp.nproc == machine.nproc, plan

    for_each(CASES, rule)


@pytest.mark.parametrize(("gpus", "nproc"), [(-1, 2), (0, 0)])
def test_a_shape_that_cannot_be_is_refused(gpus, nproc):
    with pytest.raises(ValueError, match="expected gpus >= 0 and nproc >= 1"):
        throughput_plan(gpus, nproc)
