"""Loopback nodes share the machine out: their own GPUs each (or gloo), and a fair share of cores."""

from __future__ import annotations

import signal
import subprocess

import pytest

from ddp_helpers.kernel.launcher.loopback import ElasticNode, loopback_plan, visible_gpu_ids, wait_for_line


def test_without_gpus_every_node_runs_gloo_with_its_share_of_the_cores():
    plan = loopback_plan(2, 3, gpus=0, cpus=12, environ={})
    assert plan.backend == "auto"  # "auto" is gloo where there is no GPU
    assert plan.node_env == ({"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "2"})
    assert "on the CPU with gloo" in plan.line


def test_each_node_sees_gpus_of_its_own():
    plan = loopback_plan(2, 2, gpus=4, cpus=8, environ={})
    assert plan.backend == "auto"
    assert [env["CUDA_VISIBLE_DEVICES"] for env in plan.node_env] == ["0,1", "2,3"]
    assert "node 1: CUDA_VISIBLE_DEVICES=2,3" in plan.line


def test_gpu_slices_follow_an_existing_cuda_visible_devices():
    plan = loopback_plan(2, 1, gpus=2, cpus=2, environ={"CUDA_VISIBLE_DEVICES": "5, 7"})
    assert [env["CUDA_VISIBLE_DEVICES"] for env in plan.node_env] == ["5", "7"]
    assert visible_gpu_ids(2, {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}) == ["GPU-aa", "GPU-bb"]


@pytest.mark.parametrize("gpus", [1, 3])
def test_too_few_gpus_means_gloo_and_a_line_that_says_so(gpus):
    plan = loopback_plan(2, 2, gpus=gpus, cpus=1, environ={})
    assert plan.backend == "gloo"
    assert all("CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "1" for env in plan.node_env)
    assert f"need 4 GPUs and this machine has {gpus}" in plan.line


def test_refuses_an_empty_job():
    with pytest.raises(ValueError):
        loopback_plan(0, 1, gpus=0)


# ------------------------------------------------------------------ elastic nodes
def test_a_wait_that_times_out_stops_the_nodes(tmp_path):
    log = tmp_path / "n.log"
    log.write_text("[rank0]: start: world 1, step 0, restart 0\n")
    node = ElasticNode("n", subprocess.Popen(["sleep", "60"], start_new_session=True), log)
    assert wait_for_line([node], r"start: world (\d+)", 1)[1] == "1"
    with pytest.raises(TimeoutError, match=r"no line matched 'done' within 0.5 s \(nodes stopped\)"):
        wait_for_line([node], "done", 0.5)
    assert node.process.poll() == -signal.SIGKILL  # nothing outlives the cell


# A node joining a running job (--nnodes 1:2) and a killed node leaving it: notebook 06 runs that demo
# and asserts each step (the world sizes, the step resumed at, no step lost), in make test and on each shape.
