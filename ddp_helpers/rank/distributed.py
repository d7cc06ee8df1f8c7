"""One place that chooses the backend and the device, for the launcher and for every worker: nccl with
one GPU per rank where GPUs exist, else gloo; the device is cuda:LOCAL_RANK (cuda:0 where SLURM gave the
task one GPU), never RANK, which on a second machine names a GPU that does not exist."""

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
    """The backend and device type for this worker: the launcher's choice, else "auto"."""
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
    """Which of the GPUs this process sees is its own: the index of its ``cuda`` device."""
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
    """Join the process group torchrun set up, or describe a plain one-process run."""
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
