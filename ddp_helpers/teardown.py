"""A worker's last step: tear the process group down, without the hang torch 2.7's gloo can hit.

Workers call `destroy_process_group()` in a ``finally`` under ``if __name__ == "__main__"``, so it runs
only after ``@record`` has written the rank's error file: closing the group first would let the other
ranks fail on the dead connection before the real error is on disk.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def gloo_destroy_can_hang(version: str = torch.__version__) -> bool:
    """torch 2.7's ProcessGroupGloo sometimes never returns from ``destroy_process_group()`` once a
    peer has exited, even after a barrier: seen here in about 1 run in 8 on torch 2.7.1 with two CPU
    ranks, never on torch 2.14 (cf. pytorch/pytorch#75097). Exiting frees gloo's sockets anyway."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) < (2, 8)


def destroy_process_group() -> None:
    """``dist.destroy_process_group()``, where it is safe; a no-op when no group was started."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo" and gloo_destroy_can_hang():
        return
    dist.destroy_process_group()
