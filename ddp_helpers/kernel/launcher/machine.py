"""What this machine offers a launch: its GPUs, its cores, a free port. No CUDA context is created."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ddp_helpers.errors import InvalidLaunchArguments

MAX_CPU_RANKS_ENV = "DDP_HELPERS_MAX_CPU_RANKS"  # the explicit override of `cpu_rank_limit`
RANKS_PER_CORE = 4  # oversubscribed, still a lesson (8 ranks on a 2-core laptop); beyond it, only thrashing
CPU_RANK_BYTES = 300 << 20  # about what one CPU rank holds once torch is imported (RSS, torch 2.7 to 2.14)


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without a CUDA build or a driver). Creates no CUDA context."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not stop a CPU run
        return 0


def visible_gpu_ids(gpus: int, environ: Mapping[str, str]) -> list[str]:
    """The ids of the `gpus` GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them."""
    listed = environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus))))
    return [part.strip() for part in listed.split(",") if part.strip()][:gpus]


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available


def cpu_rank_limit(cores: int | None = None, memory: int | None = None) -> int:
    """The most CPU ranks this machine holds: 4 per core (8 at least), and no more than its free memory."""
    cores, memory = cores or cpu_cores(), available_memory() if memory is None else memory
    return max(1, min(max(8, RANKS_PER_CORE * cores), memory // CPU_RANK_BYTES))


def check_cpu_ranks(nproc: int) -> None:
    """Refuse more CPU ranks on this node than it holds, unless $DDP_HELPERS_MAX_CPU_RANKS allows them."""
    override = os.environ.get(MAX_CPU_RANKS_ENV, "").strip()
    if override:
        try:
            limit = int(override)
        except ValueError:
            raise InvalidLaunchArguments(
                f"{MAX_CPU_RANKS_ENV} must be a whole number, got {override!r}"
            ) from None
        source = f"{MAX_CPU_RANKS_ENV}={limit}"
    else:
        cores, memory = cpu_cores(), available_memory()
        limit = cpu_rank_limit(cores, memory)
        source = (
            f"this machine's limit: {cores} core(s) × {RANKS_PER_CORE}, and {memory / 2**30:.1f} GiB free "
            f"at about {CPU_RANK_BYTES >> 20} MiB per rank"
        )
    if nproc > limit:
        raise InvalidLaunchArguments(
            f"nproc={nproc} CPU ranks on this node is more than {limit} ({source}); each rank is a process "
            f"that imports torch. Use nproc<={limit}, or set {MAX_CPU_RANKS_ENV}={nproc} to run them anyway"
        )
