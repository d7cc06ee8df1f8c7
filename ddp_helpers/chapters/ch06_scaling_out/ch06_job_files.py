"""What the cluster job files share: the job's shape check, the worker's arguments, torchrun's settings.

`cluster_templates` (SLURM) and `trainjob` (Kubernetes) both build on this.
"""

from __future__ import annotations

from collections.abc import Sequence

CPUS_PER_RANK = 4  # DataLoader workers and the rank itself; raise it for image decoding
MAX_RESTARTS = 3  # torchrun restarts every worker this many times after a failure, then gives up
# torchrun prefixes each tee'd line with this (its ${rank} is the global rank): the `[rank N]` of launch()
LOG_LINE_PREFIX = "[rank${rank}]: "
# torchrun keeps one shared TCPStore across restart rounds, so restarted workers can read the dead
# workers' addresses and fail with "connectFullMesh ... Connection refused" or hang (seen on torch 2.14
# on two SLURM nodes; cf. pytorch/pytorch#167288). A fresh store per round avoids it (launch() does the same).
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
FRESH_STORE_LINES = [
    "# a fresh rendezvous store per restart round: with the shared one, restarted workers can read the",
    "# dead workers' addresses (torch 2.14; pytorch/pytorch#167288)",
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
]


def check_job_shape(
    nnodes: int, nproc_per_node: int, cpus_per_rank: int = 1, min_nodes: int | None = None
) -> None:
    if nnodes < 1 or nproc_per_node < 1 or cpus_per_rank < 1:
        raise ValueError("nnodes, nproc_per_node and cpus_per_rank must be >= 1")
    if min_nodes is not None and not 1 <= min_nodes <= nnodes:
        raise ValueError(f"min_nodes must be between 1 and nnodes ({nnodes}), got {min_nodes}")


def worker_args_for(
    worker_args: Sequence[object], checkpoint_dir: str | None, save_on_sigterm: bool = False
) -> list[str]:
    args = list(map(str, worker_args))
    if checkpoint_dir is not None:  # train.py's flags: save there, and resume from there after a restart
        args += ["--checkpoint-dir", checkpoint_dir, "--resume"]
        if save_on_sigterm:  # a preemption notice: save at the next logged step, then stop
            args.append("--save-on-sigterm")
    return args
