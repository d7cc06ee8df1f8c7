"""ddp_helpers: launch, watch and measure PyTorch DDP runs from a Jupyter notebook (docs/reference.md).

Names load on first use (PEP 562): a worker that imports the rank side never pays for the launcher."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ddp_helpers.errors import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchFailed,
    LaunchInterrupted,
    LaunchTimeout,
    RankError,
    RanksNotRunning,
    RunDirInUse,
    WorkerFailed,
)

_LAZY = {
    "ClaimFailed": "ddp_helpers.kernel.lab.claims",
    "check": "ddp_helpers.kernel.lab.claims",
    "check_equal": "ddp_helpers.kernel.lab.claims",
    "LiveRanks": "ddp_helpers.kernel.live.ranks",
    "OnRank": "ddp_helpers.rank.rank_call",
    "RankResults": "ddp_helpers.kernel.live.ranks",
    "start_ranks": "ddp_helpers.kernel.live.ranks",
    "LaunchResult": "ddp_helpers.kernel.launcher.runner",
    "launch": "ddp_helpers.kernel.launcher.runner",
    "processes_marked": "ddp_helpers.kernel.launcher.processes",
    "read_metrics": "ddp_helpers.kernel.launcher.runner",
    "read_summary": "ddp_helpers.kernel.launcher.runner",
    "write_worker": "ddp_helpers.kernel.launcher.worker_files",
}

if TYPE_CHECKING:
    from ddp_helpers.kernel.lab.claims import ClaimFailed, check, check_equal
    from ddp_helpers.kernel.launcher.processes import processes_marked
    from ddp_helpers.kernel.launcher.runner import LaunchResult, launch, read_metrics, read_summary
    from ddp_helpers.kernel.launcher.worker_files import write_worker
    from ddp_helpers.kernel.live.ranks import LiveRanks, RankResults, start_ranks
    from ddp_helpers.rank.rank_call import OnRank


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython: Any) -> None:  # %load_ext ddp_helpers
    from ddp_helpers.kernel.exercises.exercise_magics import ExerciseMagics
    from ddp_helpers.kernel.live.live_magics import RanksMagics

    ipython.register_magics(RanksMagics, ExerciseMagics)


__all__ = [
    "ClaimFailed",
    "InvalidLaunchArguments",
    "LaunchError",
    "LaunchFailed",
    "LaunchInterrupted",
    "LaunchResult",
    "LaunchTimeout",
    "LiveRanks",
    "OnRank",
    "RankError",
    "RankResults",
    "RanksNotRunning",
    "RunDirInUse",
    "WorkerFailed",
    "check",
    "check_equal",
    "launch",
    "processes_marked",
    "read_metrics",
    "read_summary",
    "start_ranks",
    "write_worker",
]
