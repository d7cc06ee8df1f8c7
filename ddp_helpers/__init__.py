"""ddp_helpers: launch, watch and measure PyTorch DDP runs from a Jupyter notebook.

The public API:
    launch(script, *args, nproc=..., ...) -> LaunchResult
    write_worker(name_or_path, run_dir=...) -> Path
    start_ranks(nproc=...) -> LiveRanks: DDP ranks that stay up between cells
    %load_ext ddp_helpers, then %%torchrun --nproc 2, or %ranks start and %%ranks
"""

from .errors import InvalidLaunchArguments, LaunchError, LaunchFailed, LaunchTimeout, RankError, WorkerFailed
from .launch import LaunchInterrupted, LaunchResult, launch
from .live_ranks import LiveRanks, RankResults, start_ranks
from .metrics import read_metrics, read_summary
from .worker_files import write_worker


def load_ipython_extension(ipython):  # %load_ext ddp_helpers
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
