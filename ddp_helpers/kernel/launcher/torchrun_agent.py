"""torchrun's agent, run so that no process of the run outlives it or its owner (docs/architecture.md).

python -m ddp_helpers.kernel.launcher.torchrun_agent [torchrun options] -- script.py [args]"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator

import psutil

PR_SET_CHILD_SUBREAPER = 36
GRACE_ENV = "DDP_HELPERS_GRACE_S"
OWNER_FD_ENV = "DDP_HELPERS_OWNER_FD"
log = logging.getLogger(__name__)  # no handler: Python writes a warning to stderr, which the launcher shows


def become_subreaper() -> bool:
    """Make orphaned descendants (a helper that double-forks) re-parent here, not to init; False if not Linux."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result: int = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # ctypes returns a C int as int
        return result == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    """The live direct children of `pid`."""
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
    return found


def ended_children() -> Iterator[tuple[int, int]]:
    """Reap each child that has ended (orphans included), none staying a zombie: its pid and wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def stop_children(grace_s: float) -> list[int]:
    """SIGTERM every child (and its group), wait up to `grace_s`, SIGKILL the rest. Returns those killed."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    signalled: set[int] = set()
    while (left := children(me)) and time.monotonic() < deadline:
        for pid in set(left) - signalled:
            signal_group(pid, signal.SIGTERM)
            signalled.add(pid)
        time.sleep(0.05)
        # orphans of orphans arrive here as their parents exit: the loop catches them too
        list(ended_children())
    killed = children(me)
    while killed_now := children(me):
        for pid in killed_now:
            signal_group(pid, signal.SIGKILL)
        time.sleep(0.05)
        list(ended_children())
    return killed


def signal_group(pid: int, sig: int) -> None:
    """`sig` to `pid`, or to its whole group where it leads one (its DataLoader workers share it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)


class OwnerGone(Exception):
    """Raised in the main thread by SIGTERM: the owner died, or someone asked the agent to stop."""


def _stop_on_sigterm(signum: int, frame: object) -> None:
    # until torchrun installs its own handler (it stops its workers, then raises), and after it
    # restores ours: unwind into main's `finally`, which stops every child
    raise OwnerGone(f"signal {signum}")


def watch_owner(fd: int, grace_s: float) -> None:
    """Block until the owner's end of the lifeline closes (it died), then stop the run."""
    # not PR_SET_PDEATHSIG: that fires when the parent *thread* exits, and a kernel may launch from a thread
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):  # the owner never writes: only end-of-file (its death) returns b""
            pass
    log.warning("[ddp_helpers] the launcher that owns this run is gone: stopping the run")
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun stops its workers as on any SIGTERM
    # If torchrun's own shutdown waits longer than the grace period (a worker that ignores SIGTERM
    # makes it wait 30 s), kill what is left from here and leave.
    time.sleep(grace_s + 1.0)
    stop_children(0.0)
    os._exit(128 + signal.SIGTERM)


def _watch_owner_if_asked(grace_s: float) -> None:
    fd_text = os.environ.pop(OWNER_FD_ENV, None)  # popped: the workers must not read a stale number
    if not fd_text:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)  # only the agent holds the read end
    import threading

    threading.Thread(target=watch_owner, args=(fd, grace_s), name="watch-owner", daemon=True).start()


def tolerate_half_written_error_files() -> None:
    """Read a rank's half-written error file as none, instead of failing the whole run."""
    # torchrun json.loads each failed rank's @record file, and a rank stopped by SIGTERM while @record
    # writes leaves it empty: the agent would end with "exited with code 1" instead of naming the rank
    try:
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        # torch leaves it unannotated; it returns None
        read: Callable[[ProcessFailure], None] = ProcessFailure.__post_init__
    except (ImportError, AttributeError):  # a torch that moved it: torchrun as it is
        return
    if getattr(read, "tolerates_half_written", False):
        return

    def post_init(self: ProcessFailure) -> None:
        try:
            read(self)
        except (ValueError, KeyError, TypeError):  # half-written, or JSON that @record did not write
            self.error_file = ""  # no file: torchrun's own "no reply" path, with a message from the exit code
            read(self)

    post_init.tolerates_half_written = True  # type: ignore[attr-defined]
    ProcessFailure.__post_init__ = post_init  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    become_subreaper()
    grace_s = float(os.environ.get(GRACE_ENV, "5"))
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    code = 0
    try:
        _watch_owner_if_asked(grace_s)
        from torch.distributed.run import main as torchrun_main

        tolerate_half_written_error_files()
        torchrun_main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except OwnerGone:
        code = 128 + signal.SIGTERM
    except Exception:  # noqa: BLE001 - torchrun's ChildFailedError etc.: report like torchrun
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop_children(grace_s)
    return code


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # Leave without interpreter finalization: torchrun is done and its output flushed, and after a
    # SIGTERM its leftover threads could hold the exit for seconds (the launcher then needs SIGKILL).
    os._exit(status)
