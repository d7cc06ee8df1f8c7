"""Notebook 06's plan: loopback nodes on one box, each with its own share of the GPUs; the stopped-node demo
on the CPU everywhere."""

from __future__ import annotations

import pytest
from plan_rules import KINDS, at_least_two, every_shape, placed, sizes_by_kind

from ddp_helpers.chapters.ch06_scaling_out.ch06_plan import node_envs
from ddp_helpers.kernel.lab.plan_core import NotebookPlan, plan_for

JOBS = ("whoami", "allreduce", "missing-node", "elastic")  # nproc ranks on each of the machine's nodes
# a gloo collective's timeout shows the same on a CPU; the SLURM test cluster's nodes have no GPUs
ON_THE_CPU = ("stopped-node", "slurm-whoami")


def test_the_jobs_span_every_node_each_rank_on_a_gpu_of_its_own_where_its_node_has_one():
    def rule(plan: NotebookPlan) -> None:
        m = plan.machine
        for name in JOBS:
            placed(m, plan.runs[name], m.nproc, nodes=m.nodes)
            assert plan.runs[name].world == m.nodes * m.nproc
        for name in ON_THE_CPU:
            run = plan.runs[name]
            assert (run.nproc, run.nodes, run.device) == (m.nproc, m.nodes, "cpu"), (name, run)
            if m.gpus:
                assert run.backend == "gloo" and run.env["CUDA_VISIBLE_DEVICES"] == "", (name, run)
        placed(m, plan.runs["exercises"], at_least_two(m))  # live ranks, on one node

    every_shape("06", rule)


@pytest.mark.parametrize("cpus", [2, 16])
def test_each_node_sees_only_its_own_gpus_and_its_share_of_the_cores(cpus):
    """Two agents on one box would otherwise both put their local rank 0 on cuda:0, and each hand its ranks
    every core. On the CPU every GPU is hidden from every node, the odd one left over too."""

    def rule(plan: NotebookPlan) -> None:
        m = plan.machine
        box = [str(i) for i in range(m.gpus * m.nodes + 1)]  # the GPUs the nodes share, and one left over
        for name, run in plan.runs.items():
            envs = node_envs(run, box, cpus)
            assert len(envs) == run.nodes, (name, envs)
            threads = {int(env["OMP_NUM_THREADS"]) for env in envs}
            assert len(threads) == 1 and (threads.pop() * run.world <= cpus or cpus < run.world), (name, envs)
            if run.device == "cpu":
                assert all(env["CUDA_VISIBLE_DEVICES"] == "" for env in envs), (name, envs)
                if not m.gpus:  # a box without GPUs: nothing to hide
                    no_gpus = node_envs(run, [], cpus)
                    assert all("CUDA_VISIBLE_DEVICES" not in env for env in no_gpus), (name, no_gpus)
                continue
            own = [env["CUDA_VISIBLE_DEVICES"].split(",") for env in envs]
            assert all(len(ids) == run.nproc for ids in own), (name, own)
            assert sorted(sum(own, []), key=int) == box[: run.world], (name, own)  # disjoint, none twice

    every_shape("06", rule)


def test_too_few_gpus_for_a_gpu_run_is_refused():
    job = plan_for("06", 2, 2, nodes=2).runs["whoami"]
    with pytest.raises(ValueError, match="4 ranks on GPUs of their own, but this box has 3 GPUs"):
        node_envs(job, ["0", "1", "2"], cpus=4)


def test_a_gpu_link_sweeps_larger_messages_than_a_cpu_and_smoke_mode_waits_no_longer():
    sizes = sizes_by_kind("06")
    assert sizes["cuda", False]["max_bytes"] > sizes["cpu", False]["max_bytes"], sizes
    for kind in KINDS:
        full, smoke = sizes[kind, False], sizes[kind, True]
        assert smoke["max_bytes"] < full["max_bytes"], (kind, sizes)
        assert smoke.keys() == full.keys() and all(smoke[k] <= full[k] for k in full), (smoke, full)
