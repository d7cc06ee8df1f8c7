"""The legacy Kubeflow PyTorchJob (kubeflow.org/v1) for a notebook's worker (see `pytorchjob_manifest`).

For clusters that still run the v1 training operator, which the Kubeflow project now files under
"Legacy". The Kubernetes file the workbench writes first is Kubeflow Trainer v2's ``TrainJob``
(trainjob.py); cluster_templates.py writes this one beside it, as ``pytorchjob-legacy-v1.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import yaml

from ddp_helpers.chapters.ch06_scaling_out.ch06_job_files import (
    CPUS_PER_RANK,
    FRESH_STORE,
    MAX_RESTARTS,
    check_job_shape,
    worker_args_for,
)
from ddp_helpers.run_contract import RUN_DIR_ENV

# Built from docker/Dockerfile (the name docker/compose.yaml gives it). A cluster pulls images from
# a registry: tag and push it there, then pass image="registry.example.com/you/ddp-workbench:tag".
DEFAULT_IMAGE = "ddp-workbench:latest"
# Where docker/Dockerfile copies the repository's package (WORKDIR, then COPY ddp_helpers ./ddp_helpers):
# the pods' working folder, so that a worker path relative to the repository is found.
IMAGE_REPO_DIR = "/opt/ddp-workbench"
# The image's working folder (owned by its non-root user).
IMAGE_WORKSPACE = "/workspace"
# The image's user and group (docker/Dockerfile: USER_UID, useradd's group): the pods run as them, and
# fsGroup makes the volumes they mount writable by that group.
IMAGE_UID = IMAGE_GID = 1000
# Where every pod mounts the job's shared ReadWriteMany volume: runs and checkpoints go there, so a
# restarted pod (and rank 0 in another pod) finds them.
SHARED_MOUNT = "/shared"
SHARED_STORAGE = "100Gi"  # the shared volume's size request


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
    shared_storage: str = SHARED_STORAGE,
    storage_class: str | None = None,
) -> str:
    """A shared volume's claim and a Kubeflow PyTorchJob (kubeflow.org/v1) with an elasticPolicy:
    `nnodes` Worker pods running torchrun. Two YAML documents: ``kubectl apply -f`` creates both.

    The ``elasticPolicy`` makes the operator pass a c10d rendezvous, ``--nnodes min_nodes:nnodes``
    and ``--max-restarts`` to torchrun (``PET_*`` variables), so a restarted pod rejoins the job
    at the next rendezvous; without it the job uses the static rendezvous of a fixed Master pod.
    `image` must hold this package: the default is the image docker/Dockerfile builds (the stock
    pytorch/pytorch image has no ddp_helpers, so ``train.py`` would fail on its first import).
    Pods start in the repository's copy inside the image (``IMAGE_REPO_DIR``), so a relative
    `worker` such as ``ddp_helpers/workers/train.py`` is found there. That folder is read-only for
    the image's user; what the job writes goes to volumes: every pod mounts the ReadWriteMany claim
    ``<name>-shared`` (`shared_storage`, of `storage_class` or the cluster's default class, which must
    offer ReadWriteMany) at `SHARED_MOUNT`, where the runs go (``DDP_RUN_DIR``) and where
    `checkpoint_dir` must lie (after a restart rank 0 may be another pod). The pods run as the image's
    user, and ``fsGroup`` makes the volumes writable by its group.
    """
    check_job_shape(nnodes, nproc_per_node, cpus_per_rank, min_nodes)
    check_shared(checkpoint_dir)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    claim = f"{name}-shared"
    command = ["torchrun", worker, *worker_args_for(worker_args, checkpoint_dir)]
    container = _pod_container(image, command, name, cpus_per_rank, gpus, fresh_store=max_restarts > 0)
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
            "pytorchReplicaSpecs": {"Worker": _worker_spec(nnodes, container, claim)},
        },
    }
    return yaml.safe_dump_all([volume_claim(claim, shared_storage, storage_class), manifest], sort_keys=False)


def check_shared(checkpoint_dir: str | None) -> None:
    if checkpoint_dir is not None and not _under(checkpoint_dir, SHARED_MOUNT):
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r} must lie under {SHARED_MOUNT}, where every pod mounts the "
            "shared volume: elsewhere a pod's checkpoints are lost with it, and other pods never see them"
        )


def _under(path: str, folder: str) -> bool:
    normal = os.path.normpath(path)
    return os.path.isabs(path) and (normal == folder or normal.startswith(folder + "/"))


def _pod_container(
    image: str, command: list[str], name: str, cpus_per_rank: int, gpus: int, fresh_store: bool
) -> dict[str, Any]:
    """The Worker pods' one container: the image, torchrun's command, threads, volumes, GPUs."""
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator looks for a container with this name
        "image": image,
        "command": command,
        "workingDir": IMAGE_REPO_DIR,
        "env": [
            {"name": RUN_DIR_ENV, "value": f"{SHARED_MOUNT}/runs/{name}"},  # the workers' --run-dir
            {"name": "OMP_NUM_THREADS", "value": str(cpus_per_rank)},  # torchrun would set 1
            # a fresh rendezvous store per restart round (see FRESH_STORE)
            *([{"name": k, "value": v} for k, v in FRESH_STORE.items()] if fresh_store else []),
        ],
        "volumeMounts": [
            {"name": "shared", "mountPath": SHARED_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return container


def _worker_spec(nnodes: int, container: dict[str, Any], claim: str) -> dict[str, Any]:
    """The Worker pods: `nnodes` of them, as the image's user, with the shared claim and two emptyDirs."""
    return {
        "replicas": nnodes,
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                # the image's user (docker/Dockerfile), and its group owns the mounted volumes
                "securityContext": {
                    "runAsUser": IMAGE_UID,
                    "runAsGroup": IMAGE_GID,
                    "runAsNonRoot": True,
                    "fsGroup": IMAGE_GID,
                    "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a full volume at each start
                },
                "containers": [container],
                "volumes": [
                    # runs and checkpoints: one volume that every pod mounts, and that outlives them
                    {"name": "shared", "persistentVolumeClaim": {"claimName": claim}},
                    {"name": "tmp", "emptyDir": {}},  # torchrun's log folder and other temporary files
                    # DataLoader workers and NCCL need more shared memory than a pod's default
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                ],
            }
        },
    }


def volume_claim(claim: str, shared_storage: str, storage_class: str | None) -> dict[str, Any]:
    """The ReadWriteMany claim every pod mounts at `SHARED_MOUNT`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteMany"],  # every pod, on any node, mounts it read-write
            **({"storageClassName": storage_class} if storage_class else {}),
            "resources": {"requests": {"storage": shared_storage}},
        },
    }
