"""Start a run's top process so that it dies with its owner, and stop the whole run: every descendant seen is
signalled directly, with its group (torchrun gives each worker a session of its own). A `RunProcess` is
``"forked"`` (`agent_client.ForkedAgent`), ``"fresh"`` (a new agent) or ``"none"`` (the script alone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from typing import BinaryIO, Literal

import psutil

from ddp_helpers.errors import LaunchInterrupted
from ddp_helpers.kernel.launcher.agent_client import (
    ForkedAgent,
    reap,
    reap_stopped_servers_in_background,
    start_agent,
    stop_servers,
    wait_for_stopped_servers,
)
from ddp_helpers.kernel.launcher.config import LaunchConfig
from ddp_helpers.kernel.launcher.torchrun_agent import OWNER_FD_ENV, signal_group
from ddp_helpers.run_contract import STDERR_LOG, STDOUT_LOG


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


class FreshProcess:
    """A process this one started itself (`subprocess.Popen`): torchrun's agent, or the script alone."""

    def __init__(self, popen: subprocess.Popen[bytes], kind: Literal["fresh", "none"]) -> None:
        self.popen, self.pid = popen, popen.pid
        self.kind: str = kind
        self.returncode: int | None = None
        self.wait_s, self.status_lost = 0.0, False

    def poll(self) -> int | None:
        self.returncode = reap(self.popen)
        return self.returncode


# what the launcher needs of a run's top process: pid, returncode (negative: a signal), poll(), kind
# ("forked", "fresh" or "none"), wait_s (the launch's wait for it) and status_lost (see ForkedAgent)
RunProcess = FreshProcess | ForkedAgent


# each run's lifeline's write end, held open until `stop_run` (or the garbage collector) closes it
LIFELINES: weakref.WeakKeyDictionary[RunProcess, BinaryIO] = weakref.WeakKeyDictionary()


def die_with_owner(owner_pid: int) -> Callable[[], None] | None:
    """A one-process run has no agent watching a lifeline: SIGKILL it when the launching thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # looked up in the parent: between fork and exec the child must not import (another thread may hold the lock)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != owner_pid:  # the owner died before the line above took effect
            os._exit(1)

    return arm


def start_run(config: LaunchConfig, env: dict[str, str] | None = None) -> RunProcess:
    """Spawn torchrun (or the one process) in a session of its own, its output to files; stop it with `stop_run`."""
    direct = config.launcher == "python"
    out_dir = config.direct_log_dir if direct else config.log_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # no agent: the process writes straight into the files torchrun's --redirects would write
    stdout = open(out_dir / STDOUT_LOG if direct else config.agent_log, "wb")
    stderr = open(out_dir / STDERR_LOG, "wb") if direct else None  # None: with torchrun's output
    env = dict(config.environment() if env is None else env)
    if env.get("MPLBACKEND", "").startswith("module://") and "MPLBACKEND" not in config.env:
        # the kernel's inline backend means nothing in a worker (plt.show() would print
        # "Figure(640x480)"): workers draw off-screen and save their figures to files
        env["MPLBACKEND"] = "Agg"
    # The agent's lifeline: it holds the read end, this process the only write end. However this
    # process dies, the agent reads end-of-file and stops the run (torchrun_agent.watch_owner).
    lifeline_read, lifeline_write = (None, None) if direct else os.pipe()
    proc: RunProcess | None
    if lifeline_read is not None:
        env[OWNER_FD_ENV] = str(lifeline_read)
    try:
        asked, proc = time.monotonic(), None
        if lifeline_read is not None:  # torchrun's agent, forked by a warm agent server where one can
            proc = start_agent(sys.executable, config.agent_args(), env, stdout.fileno(), lifeline_read)
        if proc is not None:
            proc.wait_s = time.monotonic() - asked
        else:
            popen = subprocess.Popen(
                config.command(),
                stdout=stdout,
                stderr=subprocess.STDOUT if stderr is None else stderr,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # the whole run can be signalled without touching the kernel
                pass_fds=() if lifeline_read is None else (lifeline_read,),
                preexec_fn=die_with_owner(os.getpid()) if direct else None,
            )
            proc = FreshProcess(popen, "none" if direct else "fresh")
    except BaseException:
        if lifeline_write is not None:
            os.close(lifeline_write)
        raise
    finally:
        stdout.close()  # the child holds its own copies
        if stderr is not None:
            stderr.close()
        if lifeline_read is not None:
            os.close(lifeline_read)
    if lifeline_write is not None:
        LIFELINES[proc] = open(lifeline_write, "wb", buffering=0)
    return proc


def stop_run(tree: ProcessTree, proc: RunProcess, grace_s: float) -> list[int]:
    """Stop every process of the run: SIGTERM, then SIGKILL for what is left after `grace_s`."""
    killed = tree.terminate(grace_s)
    if not wait_for_exit(proc, grace_s + 5):
        try:  # not reaped yet, so the pid is still ours (a forked agent's server reaps it: it may be gone)
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_for_exit(proc, None)
    lifeline = LIFELINES.pop(proc, None)
    if lifeline is not None:
        lifeline.close()
    return killed


def exit_code(proc: RunProcess | subprocess.Popen[bytes]) -> int | None:
    """The run's exit code (negative: the signal that ended it), or None while it runs. Reaps it."""
    return reap(proc) if isinstance(proc, subprocess.Popen) else proc.poll()


def wait_for_exit(proc: RunProcess | subprocess.Popen[bytes], timeout_s: float | None) -> bool:
    """Wait up to `timeout_s` (None: for as long as it takes) for the run to end; True if it did."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while exit_code(proc) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_interrupted(tree: ProcessTree, proc: RunProcess, config: LaunchConfig) -> LaunchInterrupted:
    """Stop an interrupted run and the agent servers; the `LaunchInterrupted` that says how."""
    killed, hurried = stop_despite_interrupts(tree, proc, config.grace_s)
    try:
        stop_servers()  # an interrupted cell leaves no process: not even the agent server,
        wait_for_stopped_servers(0.0 if hurried else 0.5)  # which leaves at once unless live ranks use it
    except KeyboardInterrupt:
        hurried = True
    reap_stopped_servers_in_background()  # whatever has not left yet is reaped later: no zombie stays
    detail = f" ({len(killed)} needed SIGKILL)" if killed else ""
    if hurried:
        detail += ", at once: you interrupted again"
    return LaunchInterrupted(
        f"interrupted: every process of the run was stopped{detail}; logs are in {config.out_dir}"
    )


def stop_despite_interrupts(tree: ProcessTree, proc: RunProcess, grace_s: float) -> tuple[list[int], bool]:
    """`stop_run`, which a second interrupt only hurries (SIGKILL at once); the pids killed, and if hurried."""
    try:
        return stop_run(tree, proc, grace_s), False
    except KeyboardInterrupt:
        pass
    while True:
        try:
            return stop_run(tree, proc, 0.0), True
        except KeyboardInterrupt:  # a third, a fourth: the stop goes on, as fast as it can
            continue
