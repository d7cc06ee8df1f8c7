"""ddp_helpers: launch, watch and measure PyTorch DDP runs from a Jupyter notebook.

The public API:
    launch(script, *args, nproc=..., ...) -> LaunchResult
    write_worker(name_or_path, run_dir=...) -> Path
    %load_ext ddp_helpers, then %%torchrun --nproc 2
"""

from .errors import InvalidLaunchArguments, LaunchError, LaunchFailed, LaunchTimeout, WorkerFailed
from .launch import LaunchInterrupted, LaunchResult, launch
from .metrics import read_metrics, read_summary

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
]
