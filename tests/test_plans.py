"""Notebook 02's plan (ddp_helpers/kernel/lab/throughput.py) over every machine shape the notebooks must run on:
GPUs in {0, 1, 2, 4, 8} x nproc in {1, 2, 3, 8}. No GPU here: the GPU shapes are tested by their plans."""

from __future__ import annotations

import itertools

import pytest

from ddp_helpers.backends import resolve_backend
from ddp_helpers.kernel.lab.plans import sweep_points, throughput_plan

SHAPES = list(itertools.product((0, 1, 2, 4, 8), (1, 2, 3, 8)))


def visible_to(run, gpus: int) -> int:
    """GPUs the run's processes see, after its env."""
    if "CUDA_VISIBLE_DEVICES" not in run.env:
        return gpus
    value = run.env["CUDA_VISIBLE_DEVICES"]
    return len(value.split(",")) if value else 0


@pytest.mark.parametrize(("gpus", "nproc"), SHAPES, ids=lambda v: str(v))
def test_nothing_is_compared_across_device_kinds(gpus, nproc):
    plan = throughput_plan(gpus, nproc)
    assert {run.device for run in plan.runs()} == {plan.device}, plan


@pytest.mark.parametrize(("gpus", "nproc"), SHAPES, ids=lambda v: str(v))
def test_each_run_computes_where_the_launcher_puts_it(gpus, nproc):
    """The backend rule the launcher and the workers share gives each run the device the plan says,
    and NCCL only where every rank of the run has a GPU of its own."""
    for run in throughput_plan(gpus, nproc).runs():
        seen = visible_to(run, gpus)
        backend, device = resolve_backend(run.backend, gpus)  # the launcher counts the kernel's GPUs
        if device == "cuda":
            assert run.nproc <= seen and backend == "nccl", run
        assert device == run.device or (run.device == "cpu" and seen == 0), run
        if run.device == "cpu":
            assert seen == 0, f"{run}: a CPU run must not see GPUs (DataParallel would reach for them)"
            assert run.env.get("OMP_NUM_THREADS") == "1", run  # a CPU device is one core


@pytest.mark.parametrize(("gpus", "nproc"), SHAPES, ids=lambda v: str(v))
def test_dataparallel_splits_over_the_gpus_ddp_uses_and_none_on_the_cpu(gpus, nproc):
    plan = throughput_plan(gpus, nproc)
    if plan.device == "cuda":
        assert visible_to(plan.dp, gpus) == plan.dp.devices == nproc == plan.ddp.devices
    else:
        assert visible_to(plan.dp, gpus) == 0 and plan.dp.devices == 1


@pytest.mark.parametrize(("gpus", "nproc"), SHAPES, ids=lambda v: str(v))
def test_the_sweep_runs_from_the_single_process_to_ddp(gpus, nproc):
    plan = throughput_plan(gpus, nproc)
    assert list(plan.sweep) == sweep_points(nproc)
    assert plan.sweep[1] == plan.single
    assert plan.sweep[nproc] == plan.ddp


def test_gpus_fewer_than_ranks_say_why_the_cpu():
    assert "NCCL needs one GPU per rank" in throughput_plan(1, 2).line
    assert throughput_plan(4, 8).device == "cpu" and throughput_plan(8, 8).device == "cuda"


@pytest.mark.parametrize(("gpus", "nproc"), [(-1, 2), (0, 0)])
def test_a_shape_that_cannot_be_is_refused(gpus, nproc):
    with pytest.raises(ValueError, match="expected gpus >= 0 and nproc >= 1"):
        throughput_plan(gpus, nproc)
