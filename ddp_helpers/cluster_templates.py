"""Job files for real clusters, generated from the same worker and arguments a notebook ran.

- `slurm_script`: an sbatch script; `srun` starts one torchrun agent per node, and the agents
  meet at a c10d rendezvous on the first node (its name from ``scontrol show hostnames``).
- `pytorchjob_manifest`: a Kubeflow training-operator ``PyTorchJob``. The operator sets the
  ``PET_*`` variables that torchrun reads (nnodes, node rank, rendezvous endpoint) in every pod.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import yaml


def _check(nnodes: int, nproc_per_node: int) -> None:
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError("nnodes and nproc_per_node must be >= 1")


def slurm_script(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    job_name: str = "ddp",
    time_limit: str = "01:00:00",
    partition: str | None = None,
    rdzv_port: int = 29500,
) -> str:
    """An sbatch script that runs `worker` with torchrun on `nnodes` nodes."""
    _check(nnodes, nproc_per_node)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the processes",
        f"#SBATCH --gpus-per-node={gpus}" if gpus else "# (no GPUs requested: gloo on CPUs)",
        f"#SBATCH --time={time_limit}",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    command = shlex.join(["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
                          "--rdzv-backend", "c10d", "--rdzv-id", "RDZV_ID", "--rdzv-endpoint", "ENDPOINT",
                          worker, *map(str, worker_args)])  # fmt: skip
    command = command.replace("RDZV_ID", '"$SLURM_JOB_ID"').replace("ENDPOINT", '"$head_node:$rdzv_port"')
    lines += [
        "set -euo pipefail",
        "",
        "# the first node of the allocation hosts the rendezvous",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"rdzv_port={rdzv_port}",
        'export MASTER_ADDR="$head_node"',
        "# export NCCL_SOCKET_IFNAME=ib0   # the interface NCCL should use, if the default is wrong",
        "# export NCCL_DEBUG=INFO          # print the transport NCCL picked (IB, sockets) at start",
        "",
        f"srun {command}",
        "",
    ]
    return "\n".join(lines)


def pytorchjob_manifest(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    image: str = "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    name: str = "ddp",
) -> str:
    """A Kubeflow PyTorchJob: one Master pod and nnodes-1 Worker pods, each running torchrun."""
    _check(nnodes, nproc_per_node)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",  # the operator looks for a container with this name
            "image": image,
            "command": ["torchrun", worker, *map(str, worker_args)],
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "containers": [container],
                # DataLoader workers and NCCL need more shared memory than a pod's default
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            }},
        }  # fmt: skip

    specs = {"Master": replica(1)}
    if nnodes > 1:
        specs["Worker"] = replica(nnodes - 1)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"nprocPerNode": str(nproc_per_node), "pytorchReplicaSpecs": specs},
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def write_cluster_templates(
    directory: str | os.PathLike[str], worker: str, worker_args: Sequence[object] = (), **options: object
) -> dict[str, Path]:
    """Write ``sbatch.sh`` and ``pytorchjob.yaml`` into `directory`; returns their paths."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    slurm_options = {k: v for k, v in options.items() if k in {"nnodes", "nproc_per_node", "gpus_per_node",
                                                               "job_name", "time_limit", "partition", "rdzv_port"}}  # fmt: skip
    k8s_options = {k: v for k, v in options.items() if k in {"image", "nnodes", "nproc_per_node", "gpus_per_node",
                                                             "name"}}  # fmt: skip
    paths = {"slurm": folder / "sbatch.sh", "kubernetes": folder / "pytorchjob.yaml"}
    paths["slurm"].write_text(slurm_script(worker, worker_args, **slurm_options))
    paths["kubernetes"].write_text(pytorchjob_manifest(worker, worker_args, **k8s_options))
    return paths
