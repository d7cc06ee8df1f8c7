"""How a one-process run dies with its owner (a run under torchrun has the agent's lifeline pipe instead)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def die_with_owner(owner_pid: int) -> Callable[[], None] | None:
    """For a one-process run, which has no agent to watch the lifeline: the kernel sends the process
    SIGKILL when the thread that started it dies (Linux's PR_SET_PDEATHSIG; launch() blocks in that
    thread for the whole run). Elsewhere it does nothing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # looked up here, in the parent: between fork and exec the child must not import (a thread of the
    # kernel may hold the import lock at fork time)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != owner_pid:  # the owner died before the line above took effect
            os._exit(1)

    return arm
