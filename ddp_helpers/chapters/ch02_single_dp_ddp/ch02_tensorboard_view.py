"""TensorBoard beside a notebook: what a run wrote, where the binary is, and no server left behind.

The notebook shows the scalars with IPython's ``%tensorboard`` magic; these helpers are the
plumbing around it, so that the notebook's cells stay about the training run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any


def tensorboard_binary() -> str:
    """The `tensorboard` command: on PATH, else next to this interpreter (a venv not on PATH)."""
    return shutil.which("tensorboard") or str(Path(sys.executable).with_name("tensorboard"))


def point_magic_at_binary() -> str:
    """Tell ``%tensorboard`` where the command is (it reads TENSORBOARD_BINARY); returns the path."""
    return os.environ.setdefault("TENSORBOARD_BINARY", tensorboard_binary())


def scalar_points(log_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Each scalar tag in a TensorBoard log folder, with how many points it holds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: len(events.Scalars(tag)) for tag in events.Tags()["scalars"]}


def servers_started_here(pid: int | None = None) -> list[Any]:
    """The TensorBoard servers (tensorboard.manager's TensorBoardInfo) whose parent is `pid`
    (default: this process, i.e. the ones ``%tensorboard`` started from this kernel)."""
    import psutil
    from tensorboard import manager

    pid = os.getpid() if pid is None else pid
    ours = []
    for info in manager.get_all():
        try:
            if psutil.Process(info.pid).ppid() == pid:
                ours.append(info)
        except psutil.Error:  # the server has exited: its info file outlived it
            continue
    return ours


def stop_at_exit(servers: list[Any]) -> None:
    """SIGTERM each server when this process exits, so no TensorBoard outlives the kernel."""
    for info in servers:
        atexit.register(_terminate, info.pid)


def _terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
