"""The Kubeflow Trainer v2 ``TrainJob`` for a notebook's worker (see `trainjob_manifest`).

The ``torch-distributed`` runtime owns the JobSet and the ``PET_*`` variables; the job sets the trainer and patches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

import yaml

from ddp_helpers.run_contract import RUN_DIR_ENV

# ---- what the SLURM files (ch06_cluster_templates.py) share: the job's shape, the worker's arguments
CPUS_PER_RANK = 4  # DataLoader workers and the rank itself; raise it for image decoding
MAX_RESTARTS = 3  # torchrun restarts every worker this many times after a failure, then gives up
# torchrun prefixes each tee'd line with this (its ${rank} is the global rank): the `[rank N]` of launch()
LOG_LINE_PREFIX = "[rank${rank}]: "
# with torchrun's shared TCPStore, restarted workers can read dead workers' addresses and fail or hang
# (torch 2.14 on SLURM; pytorch/pytorch#167288): a fresh store per round, as launch() uses
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
FRESH_STORE_LINES = [
    "# a fresh rendezvous store per restart round: with the shared one, restarted workers can read the",
    "# dead workers' addresses (torch 2.14; pytorch/pytorch#167288)",
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
]


def check_job_shape(
    nnodes: int, nproc_per_node: int, cpus_per_rank: int = 1, min_nodes: int | None = None
) -> None:
    if nnodes < 1 or nproc_per_node < 1 or cpus_per_rank < 1:
        raise ValueError("nnodes, nproc_per_node and cpus_per_rank must be >= 1")
    if min_nodes is not None and not 1 <= min_nodes <= nnodes:
        raise ValueError(f"min_nodes must be between 1 and nnodes ({nnodes}), got {min_nodes}")


def worker_args_for(
    worker_args: Sequence[object], checkpoint_dir: str | None, save_on_sigterm: bool = False
) -> list[str]:
    args = list(map(str, worker_args))
    if checkpoint_dir is not None:  # train.py's flags: save there, and resume from there after a restart
        args += ["--checkpoint-dir", checkpoint_dir, "--resume"]
        if save_on_sigterm:  # a preemption notice: save at the next logged step, then stop
            args.append("--save-on-sigterm")
    return args


# ---- the TrainJob
# docker/compose.yaml's name for docker/Dockerfile's image; push it to a registry, pass image="registry/...:tag"
DEFAULT_IMAGE = "ddp-workbench:latest"
# docker/Dockerfile's WORKDIR: a worker path relative to the repository is taken from there
IMAGE_REPO_DIR = "/opt/ddp-workbench"
# the image's user and group: the pods run as them, and fsGroup makes their volumes writable
IMAGE_UID = IMAGE_GID = 1000
# every pod's mount of the shared ReadWriteMany volume: runs and checkpoints, found again after a restart
SHARED_MOUNT = "/shared"
SHARED_STORAGE = "100Gi"  # the shared volume's size request

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime the Trainer installs (manifests/base/runtimes)
NODE = "node"  # the runtime's replicated job and its trainer container (constants.Node)
PATCH_MANAGER = "ddp-workbench"  # who owns the job's runtime patch (RuntimePatch.manager)
# set by the torch plugin; the admission webhook refuses them in spec.trainer.env
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def trainjob_manifest(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    image: str = DEFAULT_IMAGE,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    max_restarts: int = MAX_RESTARTS,
    checkpoint_dir: str | None = None,
    name: str = "ddp",
) -> str:
    """A shared ReadWriteMany claim and a ``TrainJob`` of `nnodes` pods running `worker` under torchrun (`image` holds ddp_helpers)."""
    check_job_shape(nnodes, nproc_per_node, cpus_per_rank)
    check_shared(checkpoint_dir)
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    cpus, gpu_limit = nproc_per_node * cpus_per_rank, {"nvidia.com/gpu": gpus} if gpus else {}
    claim = f"{name}-shared"
    trainer = {  # what the job sets: the image, torchrun's command, its environment, the shape
        "image": image,
        "command": [
            "torchrun",
            # c10d at the runtime's master address, where restarted agents meet again (Kubernetes expands $(VAR))
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
            f"--max-restarts={max_restarts}",
            worker if worker.startswith("/") else f"{IMAGE_REPO_DIR}/{worker}",
            *worker_args_for(worker_args, checkpoint_dir),
        ],
        "env": [
            {"name": RUN_DIR_ENV, "value": f"{SHARED_MOUNT}/runs/{name}"},  # the workers' --run-dir
            {"name": "OMP_NUM_THREADS", "value": str(cpus_per_rank)},  # torchrun would set 1
            *([{"name": k, "value": v} for k, v in FRESH_STORE.items()] if max_restarts > 0 else []),
        ],
        "numNodes": nnodes,
        "numProcPerNode": nproc_per_node,
        # each node's pod: a CPU budget for its ranks and their loaders, and its GPUs
        "resourcesPerNode": {"requests": {"cpu": cpus}, "limits": {"cpu": cpus, **gpu_limit}},
    }
    job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {
                "name": RUNTIME,
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": trainer,
            "runtimePatches": [
                {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": _pod_patch(claim)}}
            ],
        },
    }
    return yaml.safe_dump_all([volume_claim(claim), job], sort_keys=False)


def check_shared(checkpoint_dir: str | None) -> None:
    if checkpoint_dir is not None and not PurePosixPath(os.path.normpath(checkpoint_dir)).is_relative_to(
        SHARED_MOUNT
    ):
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r} must lie under {SHARED_MOUNT}, where every pod mounts the "
            "shared volume: elsewhere a pod's checkpoints are lost with it, and other pods never see them"
        )


def volume_claim(claim: str) -> dict[str, Any]:
    """The ReadWriteMany claim every pod mounts at `SHARED_MOUNT` (the cluster's default storage class)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteMany"],  # every pod, on any node, mounts it read-write
            "resources": {"requests": {"storage": SHARED_STORAGE}},
        },
    }


def _pod_patch(claim: str) -> dict[str, Any]:
    """The runtime patch: the image's user, the shared claim and two emptyDirs (``env`` goes in spec.trainer)."""
    pod_spec = {
        # the image's user (docker/Dockerfile), and its group owns the mounted volumes
        "securityContext": {
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_GID,
            "runAsNonRoot": True,
            "fsGroup": IMAGE_GID,
            "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a full volume at each start
        },
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": claim}},  # runs and checkpoints
            {"name": "tmp", "emptyDir": {}},  # torchrun's log folder and other temporary files
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # for DataLoader workers and NCCL
        ],
        "containers": [
            {
                "name": NODE,
                "volumeMounts": [
                    {"name": "shared", "mountPath": SHARED_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
            }
        ],
    }
    return {
        "spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": pod_spec}}}}]}
    }
