"""A run folder: what the ranks wrote, read after the run; an earlier launch's outputs moved aside; and
one launch at a time in it (an exclusive `flock` on ``<run_dir>/.launch.lock``, which the OS drops
however the holder ends: a killed kernel leaves no stale lock). Two launches in one folder would follow
each other's logs and share one ``logs/torchrun.log``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_helpers.errors import LaunchError, RunDirInUse
from ddp_helpers.rank.metrics import METRICS_DIR, SUMMARY_FILE
from ddp_helpers.run_contract import RUN_OUTPUTS

if TYPE_CHECKING:
    import pandas as pd


def read_metrics(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """All ranks' logged steps as one DataFrame, sorted by rank and step (empty if none)."""
    import pandas as pd  # here: a launch without a metrics table never pays for pandas

    rows: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / METRICS_DIR).glob("rank*.jsonl")):
        with open(path) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    frame = pd.DataFrame(rows)
    if not frame.empty and {"rank", "step"} <= set(frame.columns):
        frame = frame.sort_values(["rank", "step"], kind="stable")
        # after an elastic restart the steps since the last checkpoint are logged twice: keep the rerun
        frame = frame.drop_duplicates(subset=["rank", "step"], keep="last").reset_index(drop=True)
    return frame


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary rank 0 wrote at the end, or {} if the run never got there."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def keep_previous_outputs(run_dir: Path) -> Path | None:
    """Move an earlier launch's logs, metrics and summary in `run_dir` to ``run_dir/previous/<n>``, so a
    launch reads only its own files; other files (checkpoints, scripts) stay where they are."""
    found = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not found:
        return None
    previous = run_dir / "previous"
    index = 1 + max((int(p.name) for p in previous.glob("*") if p.name.isdigit()), default=0)
    target = previous / str(index)
    target.mkdir(parents=True)
    for path in found:
        shutil.move(str(path), str(target / path.name))
    return target


# ---------------------------------------------------------------------------- one launch at a time
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
