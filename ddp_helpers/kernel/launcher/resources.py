"""Sample each rank's CPU and memory while a run goes on, and each GPU's use through NVML (``nvidia-ml-py``,
the ``lab`` extra); `gpu_sampling` says why GPUs were not sampled."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psutil

from ddp_helpers.kernel.launcher.processes import ProcessTree

FULL_DISK_BYTES = 1 << 20  # under this, a failed start is most likely a full disk


def full_disk_note(folder: Any) -> str:
    """A sentence for an error, where the device holding `folder` is (almost) full; else ""."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    if free >= FULL_DISK_BYTES:
        return ""
    return (
        f" The device that holds {folder} is full ({free} bytes free): no log or result file can be written."
    )


def nvml_handles() -> tuple[list[Any], str]:
    """NVML handles of every GPU, and "sampled" or the reason there are none ("not sampled: ...")."""
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return [], "not sampled: NVML's Python binding is missing (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as err:  # noqa: BLE001 - no driver, no library: CPU figures only
        return [], f"not sampled: NVML did not start ({err})"
    return handles, "sampled" if handles else "not sampled: NVML sees no GPU"


class ResourceSampler:
    """Collects one row per rank (and per GPU) at each `sample()`, in `rows` (`LaunchResult.resources`)."""

    def __init__(self, tree: ProcessTree, gpus: bool, root_is_worker: bool = False) -> None:
        self.tree = tree
        self.root_is_worker = root_is_worker  # launched without an agent: the root is rank 0 itself
        self.rows: list[dict[str, Any]] = []
        self._ranks: dict[int, int | None] = {}  # pid -> global rank (None: not a worker)
        self.local_to_global: dict[int, int] = {}  # what the workers' environments say
        self._gpus, self.gpu_sampling = nvml_handles() if gpus else ([], "not requested (a CPU run)")
        self._started = time.monotonic()

    def _rank_of(self, proc: psutil.Process) -> int | None:
        if proc.pid in self._ranks:
            return self._ranks[proc.pid]
        rank = None
        try:  # ranks are the agent's direct children (or the root itself without an agent)
            if (proc.pid if self.root_is_worker else proc.ppid()) == self.tree.root_pid:
                env = proc.environ()
                if (
                    "RANK" not in env
                ):  # forked but not yet exec'd: the agent's environment shows. Ask again later.
                    return None
                rank = int(env["RANK"])
                if "LOCAL_RANK" in env:
                    self.local_to_global[int(env["LOCAL_RANK"])] = rank
                proc.cpu_percent(None)  # the first call only primes the counter
        except (psutil.Error, OSError, ValueError):
            rank = None
        self._ranks[proc.pid] = rank
        return rank

    def alive_pids(self) -> dict[int, int]:
        """The pid of each rank whose worker process still runs."""
        return {
            rank: proc.pid for proc in self.tree.alive() if (rank := self._ranks.get(proc.pid)) is not None
        }

    def sample(self) -> None:
        elapsed = time.monotonic() - self._started
        for proc in self.tree.alive():
            rank = self._rank_of(proc)
            with contextlib.suppress(psutil.Error):
                if rank is not None:
                    cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
                    self.rows.append(dict(elapsed_s=elapsed, rank=rank, cpu_percent=cpu, rss_bytes=rss))
        for index, handle in enumerate(self._gpus):
            try:
                import pynvml

                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            except Exception:
                continue
            self.rows.append(
                dict(elapsed_s=elapsed, gpu=index, gpu_util_percent=util, gpu_mem_used_bytes=used)
            )
