"""Job files for real clusters, generated from the same worker and arguments a notebook ran.

- `slurm_script`: an sbatch script; `srun` starts one torchrun agent per node, and the agents
  meet at a c10d rendezvous on the first node (its name from ``scontrol show hostnames``).
  A relative worker path is relative to the folder the job is submitted from (the repository).
- `pytorchjob_manifest`: a Kubeflow training-operator ``PyTorchJob``. The operator sets the
  ``PET_*`` variables that torchrun reads (nnodes, node rank, master address) in every pod.
  The pods run this project's image (docker/Dockerfile), which holds ``ddp_helpers``, and start in
  the repository's copy inside it, so a relative worker path means the same file as on SLURM.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import yaml

# Built from docker/Dockerfile (the name docker/compose.yaml gives it). A cluster pulls images from
# a registry: tag and push it there, then pass image="registry.example.com/you/ddp-workbench:tag".
DEFAULT_IMAGE = "ddp-workbench:latest"
# Where docker/Dockerfile copies the repository's package (WORKDIR, then COPY ddp_helpers ./ddp_helpers):
# the pods' working folder, so that a worker path relative to the repository is found.
IMAGE_REPO_DIR = "/opt/ddp-workbench"
# The image's writable working folder (owned by its non-root user): runs/ land here.
IMAGE_WORKSPACE = "/workspace"
CPUS_PER_RANK = 4  # DataLoader workers and the rank itself; raise it for image decoding


def _check(nnodes: int, nproc_per_node: int, cpus_per_rank: int = 1) -> None:
    if nnodes < 1 or nproc_per_node < 1 or cpus_per_rank < 1:
        raise ValueError("nnodes, nproc_per_node and cpus_per_rank must be >= 1")


def slurm_script(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    job_name: str = "ddp",
    time_limit: str = "01:00:00",
    partition: str | None = None,
    rdzv_port: int = 29500,
) -> str:
    """An sbatch script that runs `worker` with torchrun on `nnodes` nodes.

    Each node gets one task (the torchrun agent) with ``nproc_per_node * cpus_per_rank`` CPUs,
    since the agent's ranks all live inside that one task's allocation.
    """
    _check(nnodes, nproc_per_node, cpus_per_rank)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    cpus = nproc_per_node * cpus_per_rank
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the processes",
        f"#SBATCH --cpus-per-task={cpus}           # {nproc_per_node} ranks x {cpus_per_rank} cores, all in the agent's task",
        f"#SBATCH --gpus-per-node={gpus}" if gpus else "# (no GPUs requested: gloo on CPUs)",
        f"#SBATCH --time={time_limit}",
    ]  # fmt: skip
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
        "# torchrun would give each rank 1 thread; give it its share of the task's cores",
        f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{cpus_per_rank}}}"',
        "# export NCCL_SOCKET_IFNAME=ib0   # the interface NCCL should use, if the default is wrong",
        "# export NCCL_DEBUG=INFO          # print the transport NCCL picked (IB, sockets) at start",
        "",
        "# srun does not inherit --cpus-per-task from sbatch (SLURM >= 22.05): pass it on",
        f'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" {command}',
        "",
    ]
    return "\n".join(lines)


def pytorchjob_manifest(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    image: str = DEFAULT_IMAGE,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    name: str = "ddp",
) -> str:
    """A Kubeflow PyTorchJob: one Master pod and nnodes-1 Worker pods, each running torchrun.

    `image` must hold this package: the default is the image docker/Dockerfile builds (the stock
    pytorch/pytorch image has no ddp_helpers, so ``train.py`` would fail on its first import).
    Pods start in the repository's copy inside the image (``IMAGE_REPO_DIR``), so a relative
    `worker` such as ``ddp_helpers/workers/train.py`` is found there. That folder is read-only for
    the image's user: runs go to ``IMAGE_WORKSPACE/runs/<name>`` (``DDP_RUN_DIR``; mount a volume
    there to keep them), and a ``--checkpoint-dir`` must be an absolute path under a writable mount.
    """
    _check(nnodes, nproc_per_node, cpus_per_rank)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",  # the operator looks for a container with this name
            "image": image,
            "command": ["torchrun", worker, *map(str, worker_args)],
            "workingDir": IMAGE_REPO_DIR,
            "env": [
                {"name": "DDP_RUN_DIR", "value": f"{IMAGE_WORKSPACE}/runs/{name}"},  # the workers' --run-dir
                {"name": "OMP_NUM_THREADS", "value": str(cpus_per_rank)},  # torchrun would set 1
            ],
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


SLURM_OPTIONS = {"nnodes", "nproc_per_node", "gpus_per_node", "cpus_per_rank", "job_name", "time_limit",
                 "partition", "rdzv_port"}  # fmt: skip
K8S_OPTIONS = {"image", "nnodes", "nproc_per_node", "gpus_per_node", "cpus_per_rank", "name"}


def write_cluster_templates(
    directory: str | os.PathLike[str], worker: str, worker_args: Sequence[object] = (), **options: object
) -> dict[str, Path]:
    """Write ``sbatch.sh`` and ``pytorchjob.yaml`` into `directory`; returns their paths.

    `worker` is a path relative to the repository (e.g. ``ddp_helpers/workers/train.py``): the
    SLURM job is submitted from the repository, and the image holds a copy of it.
    """
    unknown = set(options) - SLURM_OPTIONS - K8S_OPTIONS
    if unknown:
        raise TypeError(f"unknown options: {', '.join(sorted(unknown))}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    slurm_options = {k: v for k, v in options.items() if k in SLURM_OPTIONS}
    k8s_options = {k: v for k, v in options.items() if k in K8S_OPTIONS}
    paths = {"slurm": folder / "sbatch.sh", "kubernetes": folder / "pytorchjob.yaml"}
    paths["slurm"].write_text(slurm_script(worker, worker_args, **slurm_options))  # type: ignore[arg-type]
    paths["kubernetes"].write_text(pytorchjob_manifest(worker, worker_args, **k8s_options))  # type: ignore[arg-type]
    return paths
