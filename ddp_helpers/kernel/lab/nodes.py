"""The public tools for several nodes on one machine, and for a real scheduler: what notebook 06 uses.

- `start_elastic_node(...)`: one node's torchrun agent of an elastic job, started as a real node would;
- `wait_for_line(nodes, pattern, timeout_s)`: the first line of the nodes' logs that matches;
- `freeze(node)`: stop every process of a node (SIGSTOP), as a machine that froze or lost power;
- `free_port()`: a port nothing listens on, for a rendezvous;
- `visible_gpus()`, `visible_gpu_ids(gpus, environ)`: this machine's GPUs, counted without a CUDA
  context, and their ids as ``CUDA_VISIBLE_DEVICES`` names them (for each loopback node's share);
- `slurm`: submit a job file to SLURM (`slurm.submit`), follow it (`slurm.follow`), and say why SLURM
  cannot run here (`slurm.missing_reason`).

They live in the launcher; this module is the name a notebook imports them by, so the launcher's
modules stay free to change.
"""

from __future__ import annotations

import signal

from ddp_helpers.kernel.launcher import slurm
from ddp_helpers.kernel.launcher.loopback import (
    ElasticNode,
    start_elastic_node,
    visible_gpu_ids,
    wait_for_line,
)
from ddp_helpers.kernel.launcher.machine import free_port, visible_gpus
from ddp_helpers.kernel.launcher.process_tree import ProcessTree

__all__ = [
    "free_port",
    "freeze",
    "slurm",
    "start_elastic_node",
    "visible_gpu_ids",
    "visible_gpus",
    "wait_for_line",
]


def freeze(node: ElasticNode) -> None:
    """Stop the node's agent and every worker it started (SIGSTOP): they stay alive with their sockets
    open and answer nothing, as on a machine that froze or lost power. `node.stop()` (SIGKILL) ends them."""
    ProcessTree(node.process.pid).signal_all(signal.SIGSTOP)
