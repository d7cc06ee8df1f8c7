"""The one stop path shared by `launch` and live ranks: SIGTERM, the grace time, then SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from ddp_helpers.kernel.launcher.processes import LIFELINES, FreshProcess, ProcessTree, stop_run

STUBBORN = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # one that obeys SIGTERM
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and one that ignores it (set after the child's start:
# a child would inherit the ignored signal)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_stop_run_kills_what_ignores_sigterm_reaps_the_root_and_may_run_twice():
    popen = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert popen.stdout is not None
    child = int(popen.stdout.readline())
    popen.stdout.close()
    proc = FreshProcess(popen, "fresh")  # as start_run wraps torchrun's agent
    lifeline = open(__file__, "rb")  # stands in for the agent's lifeline, which stop_run closes
    LIFELINES[proc] = lifeline
    tree = ProcessTree(proc.pid)
    started = time.monotonic()
    killed = stop_run(tree, proc, grace_s=0.5)
    assert killed == [proc.pid]  # the child went on SIGTERM; the root needed SIGKILL
    assert time.monotonic() - started < 5
    assert proc.returncode is not None and lifeline.closed
    assert not psutil.pid_exists(proc.pid)  # reaped: no zombie of the kernel
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert stop_run(tree, proc, grace_s=0.5) == []  # a second stop (launch's finally) finds nothing


def test_stop_run_reaps_a_run_whose_popen_lock_an_interrupt_left_held():
    """CPython's Popen.poll() leaves its lock held when a KeyboardInterrupt lands between its acquire
    and its try; Popen.wait() then blocks forever. An interrupted launch hung so. stop_run must not."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # the state such an interrupt leaves (the lock is CPython's private one: typeshed leaves it out)
    assert proc._waitpid_lock.acquire(blocking=False)  # type: ignore[attr-defined]
    try:
        started = time.monotonic()
        stop_run(ProcessTree(proc.pid), FreshProcess(proc, "fresh"), grace_s=0.5)
        assert proc.returncode == -15  # reaped, and its SIGTERM shows
        assert time.monotonic() - started < 5
        assert not psutil.pid_exists(proc.pid)
    finally:
        proc._waitpid_lock.release()  # type: ignore[attr-defined]
        proc.kill()
