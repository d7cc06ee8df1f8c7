"""Notebook 02's throughput runs (ddp_helpers/chapters/ch02_single_dp_ddp/ch02_plan.py) on every one-node shape the notebooks
must run on (tests/plan_rules.py): GPUs in {0, 1, 2, 4, 8} x nproc in {1, 2, 3, 8}, smoke and full size.
No GPU here: the GPU shapes are tested by their plans."""

from __future__ import annotations

from plan_rules import ONE_NODE, computes_where_planned, for_each, shape_name, visible_to

from ddp_helpers.chapters.ch02_single_dp_ddp.ch02_plan import plan as plan_02
from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, RunPlan

Case = tuple[Machine, NotebookPlan]
RUNS_ON = [(m, smoke) for m in ONE_NODE for smoke in (False, True)]
CASES = [(shape_name(m, smoke), (m, plan_02(m, smoke))) for m, smoke in RUNS_ON]


def throughput_runs(plan: NotebookPlan) -> list[RunPlan]:
    return [plan.runs[name] for name in plan.compared[0]]


def sweep(plan: NotebookPlan) -> dict[int, RunPlan]:
    return {int(name[6:]): run for name, run in plan.runs.items() if name.startswith("sweep-")}


def visible_ids(run, gpus: int) -> list[str]:
    """The GPU ids the run's processes see, after its env."""
    value = run.env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus))))
    return value.split(",") if value else []


def test_every_run_on_one_device_kind_gpus_where_every_ddp_rank_has_its_own():
    def rule(case: Case) -> None:
        machine, plan = case
        assert {run.device for run in throughput_runs(plan)} == {plan.device}, plan
        assert plan.device == ("cuda" if machine.gpus >= machine.nproc else "cpu"), plan.device
        says_why = "NCCL needs one GPU per rank" in plan.line.split(" The demos on live ranks")[0]
        assert says_why == (0 < machine.gpus < machine.nproc), plan.line  # GPUs left idle: why

    for_each(CASES, rule)


def test_each_run_computes_where_the_launcher_puts_it_and_a_cpu_run_sees_no_gpu_and_uses_one_core():
    def rule(case: Case) -> None:
        machine, plan = case
        for run in throughput_runs(plan):
            computes_where_planned(machine, run)
            if run.device == "cpu":  # DataParallel would reach for any GPU it sees
                assert visible_to(run, machine.gpus) == 0, run
                assert run.env.get("OMP_NUM_THREADS") == "1", run  # a CPU device is one core

    for_each(CASES, rule)


def test_dataparallel_splits_over_the_gpus_ddp_uses_and_none_on_the_cpu():
    def rule(case: Case) -> None:
        machine, plan = case
        dp, ddp = plan.runs["dataparallel"], plan.runs["ddp"]
        if plan.device == "cuda":  # DDP's rank r computes on cuda:r
            assert visible_ids(dp, machine.gpus) == [str(r) for r in range(machine.nproc)], dp
            assert dp.nproc == 1 and dp.devices == ddp.devices == machine.nproc, plan
        else:
            assert visible_ids(dp, machine.gpus) == [] and dp.devices == 1, dp

    for_each(CASES, rule)


def test_the_sweep_runs_from_the_single_process_to_ddp_by_powers_of_two():
    def rule(case: Case) -> None:
        machine, plan = case
        runs = sweep(plan)
        assert runs[1] == plan.runs["single"] and runs[machine.nproc] == plan.runs["ddp"]
        powers = {2**k for k in range(machine.nproc.bit_length()) if 2**k <= machine.nproc}
        assert list(runs) == sorted(powers | {machine.nproc}), list(runs)  # 1, 2, 4, ... and nproc
        assert all(runs[n].nproc == runs[n].devices == n for n in runs), runs
        assert plan.runs["single"].nproc == 1 and plan.runs["ddp"].nproc == machine.nproc, plan

    for_each(CASES, rule)
