"""Several "nodes" on one machine: how a loopback multi-node job shares out the GPUs and the cores.

Each torchrun agent numbers its ranks from ``LOCAL_RANK`` 0, and a rank's device is
``cuda:LOCAL_RANK``. Two agents on one machine would therefore both put a rank on ``cuda:0``, and
NCCL refuses two ranks on one GPU. So each loopback node sees only its own GPUs, through its own
``CUDA_VISIBLE_DEVICES``, just as a real node sees only its own. Where the machine has fewer GPUs
than the job has ranks, the job runs on gloo on the CPU, and the plan's line says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .launch_config import visible_gpus


@dataclass(frozen=True)
class LoopbackPlan:
    """How to launch `nnodes` agents of `nproc_per_node` ranks each on this one machine."""

    backend: str  # for launch(): "auto" (nccl with a GPU per rank, or gloo without GPUs) or "gloo"
    node_env: tuple[dict[str, str], ...]  # launch(env=...) for each node, in node order
    line: str  # one sentence for the notebook: what runs where, and why


def visible_gpu_ids(gpus: int, environ: Mapping[str, str]) -> list[str]:
    """The ids of the `gpus` GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(gpus)]
    return [part.strip() for part in listed.split(",") if part.strip()][:gpus]


def loopback_plan(
    nnodes: int,
    nproc_per_node: int,
    gpus: int | None = None,
    cpus: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LoopbackPlan:
    """Share this machine's GPUs and cores out between `nnodes` loopback nodes.

    Every node gets ``OMP_NUM_THREADS`` = cores / all ranks (the agents do not know of each other,
    so each alone would hand its ranks every core). With at least one GPU per rank, node k also
    gets ``CUDA_VISIBLE_DEVICES`` listing GPUs k*nproc_per_node ... (k+1)*nproc_per_node - 1.
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError("nnodes and nproc_per_node must be >= 1")
    gpus = visible_gpus() if gpus is None else gpus
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    environ = os.environ if environ is None else environ
    ranks = nnodes * nproc_per_node
    threads = {"OMP_NUM_THREADS": str(max(1, cpus // ranks))}
    shape = f"{nnodes} nodes x {nproc_per_node} rank(s)"
    if gpus == 0:
        return LoopbackPlan("auto", tuple(dict(threads) for _ in range(nnodes)),
                            f"{shape} on the CPU with gloo (no GPU here).")  # fmt: skip
    if gpus < ranks:
        return LoopbackPlan("gloo", tuple(dict(threads) for _ in range(nnodes)), (
            f"{shape} need {ranks} GPUs and this machine has {gpus}: the loopback job runs on gloo on the "
            "CPU instead (two nodes sharing a GPU would both put a rank on cuda:0, which NCCL refuses)."
        ))  # fmt: skip
    ids = visible_gpu_ids(gpus, environ)
    envs = tuple(
        {**threads, "CUDA_VISIBLE_DEVICES": ",".join(ids[k * nproc_per_node : (k + 1) * nproc_per_node])}
        for k in range(nnodes)
    )
    shown = "; ".join(
        f"node {k}: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" for k, env in enumerate(envs)
    )
    return LoopbackPlan("auto", envs, f"{shape} with nccl, each node on GPUs of its own ({shown}).")
