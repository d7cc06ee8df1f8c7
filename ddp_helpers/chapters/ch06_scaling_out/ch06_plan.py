"""Notebook 06: several nodes, simulated on one machine (loopback), and a job file for a real cluster.

Each node is a torchrun agent with its share of the GPUs; the stopped-node demo runs on the CPU (gloo).
"""

from __future__ import annotations

from collections.abc import Sequence

from ddp_helpers.kernel.lab.plan_core import (
    Machine,
    NotebookPlan,
    RunPlan,
    by_kind,
    placement,
    placement_line,
)

# max_bytes: the largest all_reduce across the nodes (a GPU link needs larger messages to show its
# bandwidth). The waits: the lonely node's, the elastic job's steps and membership changes, the SLURM job's
WAITS = {"missing_node_timeout": 20, "elastic_steps": 40, "elastic_wait_s": 180, "slurm_job_timeout": 300}
SMOKE_WAITS = {**WAITS, "missing_node_timeout": 5, "elastic_steps": 30}
SIZES = {
    "cpu": {"max_bytes": 1 << 24, **WAITS},
    "cuda": {"max_bytes": 1 << 28, **WAITS},
}
SMOKE_SIZES = {
    "cpu": {"max_bytes": 1 << 16, **SMOKE_WAITS},
    "cuda": {"max_bytes": 1 << 24, **SMOKE_WAITS},
}


def on_cpu(machine: Machine, ranks: int, nodes: int) -> RunPlan:
    """`ranks` gloo ranks per node on the CPU, with the GPUs (if any) hidden."""
    env = {"CUDA_VISIBLE_DEVICES": ""} if machine.gpus else {}
    return RunPlan(ranks, "gloo" if machine.gpus else "auto", "cpu", ranks, env, nodes)


def plan(machine: Machine, smoke: bool) -> NotebookPlan:
    nodes = machine.nodes
    job = placement(machine, machine.nproc, nodes=nodes)
    runs = {
        "whoami": job,
        "allreduce": job,
        "missing-node": job,  # one agent of a `nodes`-node job, whose peers never come
        "elastic": job,  # 1 to `nodes` nodes
        "stopped-node": on_cpu(machine, machine.nproc, nodes),
        "slurm-whoami": on_cpu(machine, machine.nproc, nodes),  # the SLURM test cluster's nodes have no GPUs
        "exercises": placement(machine, max(machine.nproc, 2)),  # live ranks on one node
    }
    return NotebookPlan(
        notebook="06",
        machine=machine,
        device=job.device,
        line=placement_line(machine, job),
        runs=runs,
        sizes=by_kind(job.device, SMOKE_SIZES if smoke else SIZES),
    )


def node_envs(run: RunPlan, gpu_ids: Sequence[str], cpus: int) -> list[dict[str, str]]:
    """Each loopback node's environment for `run`, on a box whose GPUs are `gpu_ids` and cores `cpus`."""
    threads = {"OMP_NUM_THREADS": str(max(1, cpus // run.world))}
    if run.device == "cpu":
        hidden = {"CUDA_VISIBLE_DEVICES": ""} if gpu_ids else {}
        return [{**threads, **run.env, **hidden} for _ in range(run.nodes)]
    if len(gpu_ids) < run.world:
        raise ValueError(f"{run.world} ranks on GPUs of their own, but this box has {len(gpu_ids)} GPUs")
    n = run.nproc
    return [
        {**threads, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids[k * n : (k + 1) * n])} for k in range(run.nodes)
    ]
