"""One place that chooses the backend and the device, for the launcher and for every worker.

Worker side: imports torch only, never the launcher.

    info = setup_distributed()        # under torchrun: set_device, init_process_group(device_id=...)
    info.rank, info.local_rank, info.world_size, info.backend, info.device

The rules, shared by `launch()` (which resolves "auto" before spawning) and the workers (which read
the launcher's choice from ``DDP_BACKEND``, or resolve "auto" themselves under plain torchrun):
- nccl with one CUDA device per process where GPUs exist, gloo on the CPU otherwise;
- the device is the rank's own among the GPUs it sees (`gpu_index`): ``cuda:LOCAL_RANK`` where every
  rank sees all the node's GPUs (torchrun), ``cuda:0`` where SLURM gave each task a GPU of its own
  (``srun --gpus-per-task=1``); never ``RANK``: on the second machine RANK starts at 8, and ``cuda:8``
  does not exist there.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddp_helpers.backends import BACKENDS, resolve_backend  # noqa: F401  (re-exported: the rule lives there)
from ddp_helpers.rank import stack_dumps
from ddp_helpers.run_contract import BACKEND_ENV, DEVICE_ENV


def worker_backend() -> tuple[str, str]:
    """The backend and device type for this worker: the launcher's choice, else "auto".

    "auto" under a plain torchrun with fewer GPUs than local ranks (two ranks on a one-GPU box) means
    gloo on the CPU: with nccl, rank 1 would ask for a ``cuda:1`` that does not exist.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = os.environ.get(BACKEND_ENV) or "auto"
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if backend == "auto" and 0 < gpus < local_ranks:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(
                f"{local_ranks} local ranks but {gpus} GPU(s) visible: NCCL needs one GPU per rank, "
                "so this run uses gloo on the CPU",
                file=sys.stderr,
                flush=True,
            )
        return "gloo", "cpu"
    return resolve_backend(backend, gpus)


def gpu_index(local_rank: int, visible_gpus: int) -> int:
    """Which of the GPUs this process sees is its own: the index of its ``cuda`` device.

    CUDA numbers the GPUs a process sees from 0, in the order of ``CUDA_VISIBLE_DEVICES``.
    - Every rank sees all the node's GPUs (torchrun, or srun with ``--gpus-per-node``): ``LOCAL_RANK``.
    - The process sees one GPU (SLURM's ``--gpus-per-task=1`` sets ``CUDA_VISIBLE_DEVICES`` to the
      task's own GPU, a different one per task): 0, whatever its ``LOCAL_RANK``.
    """
    if 0 <= local_rank < visible_gpus:
        return local_rank
    if visible_gpus == 1:
        return 0
    raise RuntimeError(
        f"LOCAL_RANK {local_rank} but {visible_gpus} GPU(s) visible to this process: give every rank "
        "all the node's GPUs (cuda:LOCAL_RANK) or one GPU of its own (cuda:0)"
    )


@dataclass(frozen=True)
class DistInfo:
    """Who this process is in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str  # "nccl", "gloo", or "none" for a plain one-process run
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.backend != "none"

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints summaries and saves files."""
        return self.rank == 0


def under_torchrun() -> bool:
    return int(os.environ.get("RANK", -1)) != -1


def setup_distributed(backend: str | None = None, timeout: timedelta | None = None) -> DistInfo:
    """Join the process group torchrun set up, or describe a plain one-process run.

    On GPUs the device is the rank's own (`gpu_index`: ``cuda:LOCAL_RANK``, or ``cuda:0`` where SLURM
    gave the task one GPU), set before ``init_process_group``, which gets it as ``device_id`` so NCCL
    connects eagerly (and its watchdog exists before the first collective).
    """
    if not under_torchrun():
        use_cuda = torch.cuda.is_available() and os.environ.get(DEVICE_ENV, "cuda") != "cpu"
        device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        return DistInfo(0, 0, 1, 1, "none", device)
    if backend is None:
        backend, device_type = worker_backend()
    else:
        device_type = "cuda" if backend == "nccl" else "cpu"
    stack_dumps.register_in_run()  # where it waits, if the launcher finds the run hung
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if device_type == "cuda":
        device = torch.device("cuda", gpu_index(local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)  # before init: NCCL binds this process to its GPU
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"device_id": device} if device_type == "cuda" else {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        dist.init_process_group(backend=backend, **kwargs)
    return DistInfo(rank, local_rank, world_size, local_world_size, backend, device)
