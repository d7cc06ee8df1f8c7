"""ddp_helpers: launch, watch and measure PyTorch DDP runs from a Jupyter notebook.

The public API:
    launch(script, *args, nproc=..., ...) -> LaunchResult
    write_worker(name_or_path, run_dir=...) -> Path
    %load_ext ddp_helpers, then %%torchrun --nproc 2
"""

from .errors import InvalidLaunchArguments, LaunchError, LaunchFailed, LaunchTimeout, WorkerFailed
from .launch import LaunchInterrupted, LaunchResult, launch
from .metrics import read_metrics, read_summary
from .worker_files import write_worker


def load_ipython_extension(ipython):  # %load_ext ddp_helpers
    from .magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "InvalidLaunchArguments",
    "LaunchError",
    "LaunchFailed",
    "LaunchInterrupted",
    "LaunchResult",
    "LaunchTimeout",
    "WorkerFailed",
    "launch",
    "read_metrics",
    "read_summary",
    "write_worker",
]
