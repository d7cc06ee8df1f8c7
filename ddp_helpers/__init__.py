"""ddp_helpers: launch, watch and measure PyTorch DDP runs from a Jupyter notebook.

The public API:
    launch(script, *args, nproc=..., ...) -> LaunchResult
    write_worker(name_or_path, run_dir=...) -> Path
    start_ranks(nproc=...) -> LiveRanks: DDP ranks that stay up between cells
    %load_ext ddp_helpers, then %%torchrun --nproc 2, or %ranks start and %%ranks

Names load on first use (PEP 562): a worker that imports ``ddp_helpers.teardown`` or the metrics
writer must not pay for the launcher, psutil, tqdm or pandas.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from .errors import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchFailed,
    LaunchInterrupted,
    LaunchTimeout,
    RankError,
    WorkerFailed,
)

_LAZY = {
    "LiveRanks": ".live_ranks",
    "RankResults": ".live_ranks",
    "start_ranks": ".live_ranks",
    "LaunchResult": ".launch",
    "launch": ".launch",
    "read_metrics": ".metrics",
    "read_summary": ".metrics",
    "write_worker": ".worker_files",
}

if TYPE_CHECKING:
    from .launch import LaunchResult, launch
    from .live_ranks import LiveRanks, RankResults, start_ranks
    from .metrics import read_metrics, read_summary
    from .worker_files import write_worker


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule ddp_helpers.launch sets the package's `launch` to that module
        # (the import system does so once the submodule has run): keep the function there instead.
        if name == "launch" and isinstance(value, types.ModuleType):
            value = value.launch
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython: Any) -> None:  # %load_ext ddp_helpers
    from .live_magics import load_ipython_extension as load_ranks
    from .magics import load_ipython_extension as load

    load(ipython)
    load_ranks(ipython)


__all__ = [
    "InvalidLaunchArguments",
    "LaunchError",
    "LaunchFailed",
    "LaunchInterrupted",
    "LaunchResult",
    "LaunchTimeout",
    "LiveRanks",
    "RankError",
    "RankResults",
    "WorkerFailed",
    "launch",
    "read_metrics",
    "read_summary",
    "start_ranks",
    "write_worker",
]
