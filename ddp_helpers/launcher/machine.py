"""What this machine offers a launch: its GPUs, its cores, a free port. No CUDA context is created."""

from __future__ import annotations

import os
import socket


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without a CUDA build or a driver). Creates no CUDA context."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not stop a CPU run
        return 0


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_rank(local_world_size: int, cores: int | None = None) -> int:
    """OMP/MKL threads for each of `local_world_size` ranks on one machine: the cores shared out.

    The same on every backend: a GPU rank's CPU work (data loading, the optimizer on CPU tensors)
    oversubscribes the cores just as a CPU rank's does.
    """
    return max(1, (cpu_cores() if cores is None else cores) // max(1, local_world_size))


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
