"""torchrun's agent, run so that no process of the run can outlive it.

    python -m ddp_helpers.agent [torchrun options] -- script.py [args]

A worker may start a helper that leaves its session (``start_new_session=True``) or double-forks, then
exit: the helper is re-parented to init and escapes any tree or process group the launcher knows. So
this process, which runs torchrun's own ``main`` in-process, first makes itself a *child subreaper*
(Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): every orphan of the run is re-parented to it instead of init.
When torchrun returns, whatever is still a child here is stopped: SIGTERM, then SIGKILL after the grace
period (``DDP_HELPERS_GRACE_S``). Elsewhere than Linux it is plain torchrun.

Imports only the standard library and torch (the agent is on every launch's critical path).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
GRACE_ENV = "DDP_HELPERS_GRACE_S"


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process. False where the OS cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    """The live direct children of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(entry))
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_children(grace_s: float) -> list[int]:
    """SIGTERM every child (and its group), wait up to `grace_s`, SIGKILL the rest. Returns those killed."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    signalled: set[int] = set()
    while (left := children(me)) and time.monotonic() < deadline:
        for pid in set(left) - signalled:
            _signal(pid, signal.SIGTERM)
            signalled.add(pid)
        time.sleep(0.05)
        _reap()  # orphans of orphans arrive here as their parents exit: the loop catches them too
    killed = children(me)
    while killed_now := children(me):
        for pid in killed_now:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    return killed


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # a group leader: its own helpers share the group
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    become_subreaper()
    from torch.distributed.run import main as torchrun_main

    code = 0
    try:
        torchrun_main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Exception as error:  # noqa: BLE001 - torchrun's ChildFailedError etc.: report like torchrun
        import traceback

        traceback.print_exc()
        code = 1
        del error
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop_children(float(os.environ.get(GRACE_ENV, "5")))
    return code


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # Leave without interpreter finalization: torchrun is done and its output flushed, and after a
    # SIGTERM its leftover threads could hold the exit for seconds (the launcher then needs SIGKILL).
    os._exit(status)
