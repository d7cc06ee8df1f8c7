"""One launch at a time in a run folder: a second launch into a folder in use is refused, never mixed.

Two launches into one `run_dir` would follow each other's log files, echo each other's lines and
share one ``logs/torchrun.log``. A launch therefore holds an exclusive `flock` on
``<run_dir>/.launch.lock`` while it runs. The kernel drops the lock when the holding process ends,
however it ends, so a killed kernel leaves no stale lock behind. The file holds the holder's pid and
start time, for the message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import LaunchError, RunDirInUse

__all__ = ["LOCK_NAME", "holding_run_dir"]

LOCK_NAME = ".launch.lock"


@contextlib.contextmanager
def holding_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` for one launch; raise `RunDirInUse` at once if another launch holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # no child inherits the lock
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise RunDirInUse(
                f"run_dir {run_dir} is in use by another launch ({holder}): two runs in one folder would "
                "mix their logs. Wait for it to end, or give this launch another run_dir (without one, "
                "each launch gets a new folder)"
            ) from None
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, f"process {os.getpid()}, started {time.strftime('%H:%M:%S')}\n".encode(), 0)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise LaunchError(
                f"nothing was started: no space left on the device that holds run_dir {run_dir}, so no log "
                "or result can be written. Free some space, or give the launch a run_dir on another device"
            ) from error
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
