"""A worker's last step: tear the process group down, without the hang torch 2.7's gloo can hit.

Workers call `destroy_process_group()` in a ``finally`` under ``if __name__ == "__main__"``, so it runs
only after ``@record`` has written the rank's error file: closing the group first would let the other
ranks fail on the dead connection before the real error is on disk.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion


def gloo_destroy_can_hang(version: str = torch.__version__) -> bool:
    """torch 2.7's ProcessGroupGloo sometimes never returns from ``destroy_process_group()`` once a
    peer has exited, even after a barrier: seen here in about 1 run in 8 on torch 2.7.1 with two CPU
    ranks, never on torch 2.14 (cf. pytorch/pytorch#75097)."""
    return TorchVersion(version) < (2, 8)  # torch's own comparison: local tags and pre-releases handled


def destroy_process_group() -> None:
    """``dist.destroy_process_group()``, where it is safe; a no-op when no group was started.

    On gloo the process then leaves without interpreter finalization, with the exit code Python would
    have given it, after printing the traceback of a failure itself:
    - where the destroy can hang (torch 2.7), it is skipped, and gloo's threads would then abort the
      normal exit (SIGABRT) now and then;
    - on torch 2.14 a rank still aborted now and then after a clean run and destroy, with "terminate
      called without an active exception" (seen twice in a day of test runs on a loaded 2-core machine).
    """
    if not dist.is_initialized():
        return
    if dist.get_backend() != "gloo":
        dist.destroy_process_group()
        return
    if not gloo_destroy_can_hang():
        dist.destroy_process_group()
    error = sys.exc_info()[1]  # the exception on its way out of main(), if any
    code = 0
    if isinstance(error, SystemExit):
        if isinstance(error.code, int):
            code = error.code
        elif error.code is not None:
            print(error.code, file=sys.stderr)
            code = 1
    elif error is not None:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
