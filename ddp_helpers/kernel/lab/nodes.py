"""What notebook 06 imports for several nodes on one machine, and for a real scheduler: elastic nodes
(`start_elastic_node`, `wait_for_line`, `freeze`), ports and GPU ids, and `slurm`."""

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
    """SIGSTOP the node's agent and workers: alive, sockets open, silent, as a frozen machine's."""
    ProcessTree(node.process.pid).signal_all(signal.SIGSTOP)
