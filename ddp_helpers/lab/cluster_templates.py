"""Job files for real clusters, generated from the same worker and arguments a notebook ran.

- `slurm_script`: an sbatch script; `srun` starts one torchrun agent per node, and the agents
  meet at a c10d rendezvous on the node that runs the batch script (the allocation's first node).
  A relative worker path is relative to the folder the job is submitted from (the repository).
  No ``MASTER_ADDR``: with c10d, torchrun reads ``--rdzv-endpoint`` and sets ``MASTER_ADDR`` and
  ``MASTER_PORT`` for its workers itself (torch/distributed/elastic/agent/server/api.py,
  ``_rendezvous``; local_elastic_agent.py, the workers' env).
- `pytorchjob_manifest`: a Kubeflow training-operator v1 ``PyTorchJob`` with an ``elasticPolicy``
  (c10d rendezvous, ``--nnodes MIN:MAX``, ``--max-restarts``). The operator sets the ``PET_*``
  variables that torchrun reads in every pod. It targets the v1 operator (kubeflow.org/v1), the
  released, stable API; its successor, Kubeflow Trainer v2's ``TrainJob`` (trainer.kubeflow.org/
  v1alpha1), is still alpha and needs a ``ClusterTrainingRuntime`` installed beside it.
  The pods run this project's image (docker/Dockerfile), which holds ``ddp_helpers``, and start in
  the repository's copy inside it, so a relative worker path means the same file as on SLURM.

Both files pass ``--max-restarts``, and with `checkpoint_dir` the worker's ``--checkpoint-dir`` and
``--resume`` (notebook 04's self-healing job): after a restart every rank resumes from the last
checkpoint. That folder must be on a filesystem every node sees (NFS, Lustre, a shared volume):
rank 0 writes it, and after a restart rank 0 may live on another node.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
MAX_RESTARTS = 3  # torchrun restarts every worker this many times after a failure, then gives up
# torchrun prefixes each tee'd line with this (its ${rank} is the global rank): the `[rank N]` of launch()
LOG_LINE_PREFIX = "[rank${rank}]: "
# torchrun keeps one shared TCPStore across restart rounds, so restarted workers can read the dead
# workers' addresses and fail with "connectFullMesh ... Connection refused" or hang (seen on torch 2.14
# on two SLURM nodes; cf. pytorch/pytorch#167288). A fresh store per round avoids it (launch() does the same).
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
FRESH_STORE_LINES = [
    "# a fresh rendezvous store per restart round: with the shared one, restarted workers can read the",
    "# dead workers' addresses (torch 2.14; pytorch/pytorch#167288)",
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
]


def _check(nnodes: int, nproc_per_node: int, cpus_per_rank: int = 1, min_nodes: int | None = None) -> None:
    if nnodes < 1 or nproc_per_node < 1 or cpus_per_rank < 1:
        raise ValueError("nnodes, nproc_per_node and cpus_per_rank must be >= 1")
    if min_nodes is not None and not 1 <= min_nodes <= nnodes:
        raise ValueError(f"min_nodes must be between 1 and nnodes ({nnodes}), got {min_nodes}")


def _nnodes(nnodes: int, min_nodes: int | None) -> str:
    """torchrun's --nnodes: N for a fixed world, MIN:MAX for an elastic one."""
    return str(nnodes) if min_nodes is None or min_nodes == nnodes else f"{min_nodes}:{nnodes}"


def _worker_args(worker_args: Sequence[object], checkpoint_dir: str | None) -> list[str]:
    args = list(map(str, worker_args))
    if checkpoint_dir is not None:  # train.py's flags: save there, and resume from there after a restart
        args += ["--checkpoint-dir", checkpoint_dir, "--resume"]
    return args


def slurm_script(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    min_nodes: int | None = None,
    max_restarts: int = MAX_RESTARTS,
    checkpoint_dir: str | None = None,
    job_name: str = "ddp",
    time_limit: str = "01:00:00",
    partition: str | None = None,
    rdzv_port: int = 29500,
) -> str:
    """An sbatch script that runs `worker` with torchrun on `nnodes` nodes.

    Each node gets one task (the torchrun agent) with ``nproc_per_node * cpus_per_rank`` CPUs,
    since the agent's ranks all live inside that one task's allocation. `min_nodes` makes the
    job elastic (``--nnodes min_nodes:nnodes``). `checkpoint_dir` (on a filesystem every node
    sees) adds the worker's ``--checkpoint-dir`` and ``--resume``. Every rank's lines reach the
    job's log prefixed ``[rankN]:`` (``--tee 3``), so a follower can echo them as launch() does.
    """
    _check(nnodes, nproc_per_node, cpus_per_rank, min_nodes)
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
        *([f"#SBATCH --partition={partition}"] if partition else []),
        *_slurm_environment(rdzv_port, cpus_per_rank, max_restarts),
        *_checkpoint_lines(checkpoint_dir),
    ]
    options = {
        "--nnodes": _nnodes(nnodes, min_nodes),
        "--nproc-per-node": nproc_per_node,
        "--max-restarts": max_restarts,
        "--tee": 3,
        "--rdzv-backend": "c10d",
        "--rdzv-id": "RDZV_ID",  # shell variables, quoted below: shlex would quote their $ away
        "--rdzv-endpoint": "ENDPOINT",
    }
    flags = [str(item) for pair in options.items() for item in pair]
    command = shlex.join(["torchrun", *flags, worker, *_worker_args(worker_args, checkpoint_dir)])
    command = command.replace("RDZV_ID", '"$SLURM_JOB_ID"').replace("ENDPOINT", '"$head_node:$rdzv_port"')
    lines += [
        "",
        "# srun does not inherit --cpus-per-task from sbatch (SLURM >= 22.05): pass it on",
        f'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" {command}',
        "",
    ]
    return "\n".join(lines)


def _checkpoint_lines(checkpoint_dir: str | None) -> list[str]:
    if checkpoint_dir is None:
        return []
    return [
        "# the checkpoints must be on a filesystem every node sees: after a restart, rank 0 may be elsewhere",
        f"mkdir -p {shlex.quote(checkpoint_dir)}",
    ]


def _slurm_environment(rdzv_port: int, cpus_per_rank: int, max_restarts: int) -> list[str]:
    """The batch script's shell lines before srun: the rendezvous host, threads, log prefixes."""
    return [
        "set -euo pipefail",
        "",
        "# the batch script runs on the allocation's first node: it hosts the rendezvous store.",
        "# (no MASTER_ADDR: with c10d, torchrun reads --rdzv-endpoint and sets MASTER_ADDR for its workers)",
        "head_node=$(hostname)",
        f"rdzv_port={rdzv_port}",
        "# torchrun would give each rank 1 thread; give it its share of the task's cores",
        f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{cpus_per_rank}}}"',
        "# --tee 3 copies every rank's stdout and stderr here, each line prefixed with its global rank",
        f"export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='{LOG_LINE_PREFIX}'",
        *(FRESH_STORE_LINES if max_restarts > 0 else []),
        "# export NCCL_SOCKET_IFNAME=ib0   # the interface NCCL should use, if the default is wrong",
        "# export NCCL_DEBUG=INFO          # print the transport NCCL picked (IB, sockets) at start",
    ]


def pytorchjob_manifest(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    image: str = DEFAULT_IMAGE,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    min_nodes: int | None = None,
    max_restarts: int = MAX_RESTARTS,
    checkpoint_dir: str | None = None,
    name: str = "ddp",
) -> str:
    """A Kubeflow PyTorchJob (kubeflow.org/v1) with an elasticPolicy: `nnodes` Worker pods running torchrun.

    The ``elasticPolicy`` makes the operator pass a c10d rendezvous, ``--nnodes min_nodes:nnodes``
    and ``--max-restarts`` to torchrun (``PET_*`` variables), so a restarted pod rejoins the job
    at the next rendezvous; without it the job uses the static rendezvous of a fixed Master pod.
    `image` must hold this package: the default is the image docker/Dockerfile builds (the stock
    pytorch/pytorch image has no ddp_helpers, so ``train.py`` would fail on its first import).
    Pods start in the repository's copy inside the image (``IMAGE_REPO_DIR``), so a relative
    `worker` such as ``ddp_helpers/workers/train.py`` is found there. That folder is read-only for
    the image's user: runs go to ``IMAGE_WORKSPACE/runs/<name>`` (``DDP_RUN_DIR``; mount a volume
    there to keep them), and `checkpoint_dir` must be an absolute path on a volume every pod mounts
    (a ReadWriteMany PersistentVolumeClaim), since after a restart rank 0 may be another pod.
    """
    _check(nnodes, nproc_per_node, cpus_per_rank, min_nodes)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    command = ["torchrun", worker, *_worker_args(worker_args, checkpoint_dir)]
    container = _pod_container(image, command, name, cpus_per_rank, gpus, fresh_store=max_restarts > 0)
    worker_spec = {
        "replicas": nnodes,
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                "containers": [container],
                # DataLoader workers and NCCL need more shared memory than a pod's default
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            }
        },
    }
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": nnodes if min_nodes is None else min_nodes,
                "maxReplicas": nnodes,
                "maxRestarts": max_restarts,
            },
            "nprocPerNode": str(nproc_per_node),
            # elastic jobs have Worker pods only: the rendezvous runs in the first one
            "pytorchReplicaSpecs": {"Worker": worker_spec},
        },
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def _pod_container(
    image: str, command: list[str], name: str, cpus_per_rank: int, gpus: int, fresh_store: bool
) -> dict[str, Any]:
    """The Worker pods' one container: the image, torchrun's command, threads, shared memory, GPUs."""
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator looks for a container with this name
        "image": image,
        "command": command,
        "workingDir": IMAGE_REPO_DIR,
        "env": [
            {"name": "DDP_RUN_DIR", "value": f"{IMAGE_WORKSPACE}/runs/{name}"},  # the workers' --run-dir
            {"name": "OMP_NUM_THREADS", "value": str(cpus_per_rank)},  # torchrun would set 1
            # a fresh rendezvous store per restart round (see FRESH_STORE)
            *([{"name": k, "value": v} for k, v in FRESH_STORE.items()] if fresh_store else []),
        ],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return container


SHARED_OPTIONS = {
    "nnodes",
    "nproc_per_node",
    "gpus_per_node",
    "cpus_per_rank",
    "min_nodes",
    "max_restarts",
    "checkpoint_dir",
}
SLURM_OPTIONS = SHARED_OPTIONS | {"job_name", "time_limit", "partition", "rdzv_port"}
K8S_OPTIONS = SHARED_OPTIONS | {"image", "name"}


def write_cluster_templates(
    directory: str | os.PathLike[str], worker: str, worker_args: Sequence[object] = (), **options: Any
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
    paths["slurm"].write_text(slurm_script(worker, worker_args, **slurm_options))
    paths["kubernetes"].write_text(pytorchjob_manifest(worker, worker_args, **k8s_options))
    return paths
