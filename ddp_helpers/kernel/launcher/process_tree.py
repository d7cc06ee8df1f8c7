"""Track every process a launch started, stop them all, and sample what each rank uses.

torchrun starts each worker in a session of its own (``start_new_session=True``), so
signalling the agent's process group does not reach the workers. We therefore remember
every descendant we have seen and signal each of them, and their groups, directly.

What a worker starts and orphans between two refreshes (a helper in a session of its own, a
double fork) is re-parented to the agent, a child subreaper (see `ddp_helpers.kernel.launcher.torchrun_agent`), which
stops it when torchrun returns; until then the next refresh sees it here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import psutil


class ProcessTree:
    """The launched root process and every descendant ever seen under it."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._known: dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        """Record the root's current descendants (a worker may have been restarted)."""
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            self._known.setdefault(proc.pid, proc)

    def alive(self) -> list[psutil.Process]:
        """The remembered processes that still run (a pid reused by a stranger is not ours)."""
        alive = []
        for proc in self._known.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return alive

    def signal_all(self, sig: int) -> None:
        for proc in self.alive():
            try:
                # A worker leads its own group: its DataLoader workers share that group.
                os.killpg(proc.pid, sig) if os.getpgid(proc.pid) == proc.pid else proc.send_signal(sig)
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                pass

    def terminate(self, grace_s: float = 5.0) -> list[int]:
        """SIGTERM everything, wait up to `grace_s`, then SIGKILL what is left.

        Returns the pids that had to be killed with SIGKILL.
        """
        self.refresh()
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = self.alive()
        for proc in survivors:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(survivors, timeout=grace_s)
        return [proc.pid for proc in survivors]


def processes_marked(name: str, value: str) -> list[int]:
    """Pids of the live processes whose environment has `name` set to `value` (this user's only:
    other users' environments cannot be read, and are skipped). A launcher under test exports a unique
    marker; every process it starts inherits it, so a process still carrying it after the launcher
    returned is one it left running."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(name) == value:
                found.append(proc.pid)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found


# Popen.poll() and wait() take a lock that CPython's subprocess module leaves held when a KeyboardInterrupt
# lands between its acquire and its try (seen here: an interrupted launch then waited forever for a
# torchrun that was already a zombie). This process is the only one that waits for its runs, so it asks
# the kernel directly, without that lock.
def reap(popen: subprocess.Popen[bytes]) -> int | None:
    """`popen`'s exit code (negative: the signal that ended it), or None while it runs; reaps it."""
    if popen.returncode is None:
        try:
            pid, status = os.waitpid(popen.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (SIGCHLD ignored): its status is lost, as Popen says
            pid, status = popen.pid, 0
        if pid == popen.pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
    return popen.returncode


# ---------------------------------------------------------------------------- what the ranks use
# CPU and memory per rank process, and each GPU's utilisation and memory through NVML (as gpustat and
# nvidia-smi do). NVML's Python binding is ``nvidia-ml-py`` (``pynvml``), in the ``lab`` extra; without it,
# or without a driver, GPUs are "not sampled" and `ResourceSampler.gpu_sampling` says why.
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
        # Ranks are the agent's direct children (or the root itself without an agent); their DataLoader
        # workers are not counted apart.
        if proc.pid not in self._ranks:
            rank = None
            try:
                parent = proc.ppid()
                is_worker = (
                    proc.pid == self.tree.root_pid if self.root_is_worker else parent == self.tree.root_pid
                )
                if is_worker:
                    env = proc.environ()
                    if "RANK" not in env:
                        # forked but not yet exec'd: the agent's environment shows. Ask again later.
                        return None
                    rank = int(env["RANK"])
                    if "LOCAL_RANK" in env:
                        self.local_to_global[int(env["LOCAL_RANK"])] = rank
                    proc.cpu_percent(None)  # the first call only primes the counter
            except (psutil.Error, OSError, ValueError):
                rank = None
            self._ranks[proc.pid] = rank
        return self._ranks[proc.pid]

    def alive_pids(self) -> dict[int, int]:
        """The pid of each rank whose worker process still runs."""
        return {
            rank: proc.pid for proc in self.tree.alive() if (rank := self._ranks.get(proc.pid)) is not None
        }

    def sample(self) -> None:
        elapsed = time.monotonic() - self._started
        for proc in self.tree.alive():
            rank = self._rank_of(proc)
            if rank is None:
                continue
            try:
                self.rows.append(
                    {
                        "elapsed_s": elapsed,
                        "rank": rank,
                        "cpu_percent": proc.cpu_percent(None),
                        "rss_bytes": proc.memory_info().rss,
                    }
                )
            except psutil.Error:
                continue
        for index, handle in enumerate(self._gpus):
            try:
                import pynvml

                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                continue
            self.rows.append(
                {
                    "elapsed_s": elapsed,
                    "gpu": index,
                    "gpu_util_percent": util.gpu,
                    "gpu_mem_used_bytes": memory.used,
                }
            )
