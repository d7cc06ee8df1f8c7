"""The kinds of process a launch starts, behind one small interface (`RunProcess`).

- ``"forked"``: torchrun's agent forked from a warm agent server that has imported torch already
  (`agent_client.ForkedAgent`; its exit code comes over the server's socket: it is not our child);
- ``"fresh"``: torchrun's agent started as a new python, where no server could fork one (`FreshProcess`);
- ``"none"``: the script itself, one process and no agent (``launcher="python"``; `FreshProcess`).

`processes.start_run` chooses and returns one; the launcher and live ranks ask it for nothing but these
members, so a new kind is one more class, not more branches.
"""

from __future__ import annotations

import os
import subprocess
from typing import Literal, Protocol

ProcessKind = Literal["forked", "fresh", "none"]


class RunProcess(Protocol):
    """What the launcher needs of a run's top process."""

    pid: int
    returncode: int | None  # None while it runs; negative: the signal that ended it
    kind: ProcessKind
    wait_s: float  # how long the launch waited for it to start (a cold server: the rest of its import)
    status_lost: bool  # it ended, but how is unknown (a forked agent whose server died first)

    def poll(self) -> int | None:
        """The exit code, or None while it runs; reaps the process once it has ended."""
        ...


class FreshProcess:
    """A process this one started itself (`subprocess.Popen`): torchrun's agent, or the script alone."""

    def __init__(self, popen: subprocess.Popen[bytes], kind: Literal["fresh", "none"]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.kind: ProcessKind = kind
        self.returncode: int | None = None
        self.wait_s = 0.0
        self.status_lost = False

    def poll(self) -> int | None:
        self.returncode = reap(self.popen)
        return self.returncode


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
