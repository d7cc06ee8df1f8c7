"""Notebook 06's plan: two loopback nodes on one box, each with its own share of the GPUs."""

from __future__ import annotations

import pytest

from ddp_helpers.chapters.ch06_scaling_out.ch06_plan import node_envs
from ddp_helpers.kernel.lab.plans import plan_for


def test_two_nodes_of_four_gpus_each_run_nccl_each_node_on_its_own_gpus():
    plan = plan_for("06", 4, 4, nodes=2)
    job = plan.runs["whoami"]
    assert (job.device, job.backend, job.nodes, job.world) == ("cuda", "auto", 2, 8)
    envs = node_envs(job, [str(i) for i in range(8)], cpus=16)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1,2,3", "4,5,6,7"]
    assert {env["OMP_NUM_THREADS"] for env in envs} == {"2"}  # 16 cores over 8 ranks, not 16 each


def test_a_box_with_one_gpu_runs_both_nodes_on_the_cpu_with_the_gpu_hidden():
    """Half of one GPU is none per node: gloo on the CPU, and the odd GPU hidden from both nodes."""
    plan = plan_for("06", 1 // 2, 1, nodes=2)
    job = plan.runs["whoami"]
    assert (job.device, job.nodes) == ("cpu", 2)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in node_envs(job, ["3"], cpus=2)] == ["", ""]
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in node_envs(job, [], cpus=2))


def test_the_stopped_node_demo_runs_on_the_cpu_on_every_box_and_gpu_sizes_are_larger():
    gpu, cpu = plan_for("06", 8, 2, nodes=2), plan_for("06", 0, 2, nodes=2)
    assert gpu.runs["stopped-node"].device == cpu.runs["stopped-node"].device == "cpu"
    assert gpu.runs["stopped-node"].backend == "gloo"  # not "auto": that would pick nccl on a GPU box
    assert gpu.sizes["max_bytes"] > cpu.sizes["max_bytes"]
    assert plan_for("06", 8, 2, nodes=2, smoke=True).sizes["max_bytes"] < gpu.sizes["max_bytes"]


def test_too_few_gpus_for_a_gpu_run_is_refused():
    job = plan_for("06", 2, 2, nodes=2).runs["whoami"]
    with pytest.raises(ValueError, match="4 ranks on GPUs of their own, but this box has 3 GPUs"):
        node_envs(job, ["0", "1", "2"], cpus=4)
