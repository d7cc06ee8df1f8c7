"""Track every process a launch started, and stop them all: torchrun puts each worker in a session of its
own, so every descendant seen is signalled directly, with its group."""

from __future__ import annotations

import signal
import time

import psutil

from ddp_helpers.kernel.launcher.torchrun_agent import signal_group


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
            signal_group(proc.pid, sig)  # a worker leads its own group

    def terminate(self, grace_s: float = 5.0) -> list[int]:
        """SIGTERM everything, wait up to `grace_s`, then SIGKILL what is left."""
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
    """Pids of this user's live processes whose environment has `name` = `value` (a marker a test exports)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(name) == value:
                found.append(proc.pid)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found
