"""A worker's last step: tear the process group down, without the hangs and aborts gloo can hit.

Workers call `destroy_process_group()` in a ``finally`` under ``if __name__ == "__main__"``, so it runs
only after ``@record`` has written the rank's error file: closing the group first would let the other
ranks fail on the dead connection before the real error is on disk.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch.distributed as dist


def destroy_process_group() -> None:
    """``dist.destroy_process_group()``, where it is safe; a no-op when no group was started.

    On gloo, the destroy is skipped and the process leaves without interpreter finalization, with the
    exit code Python would have given it, after printing the traceback of a failure itself. No C++
    destructor of the group then runs, which is where gloo went wrong:
    - torch 2.7: ``destroy_process_group()`` can hang, and skipping it alone let gloo's threads abort
      the normal exit (SIGABRT) now and then;
    - torch 2.14: ranks of a finished run aborted now and then, in the destroy or at exit, with
      "terminate called without an active exception" (SIGABRT, once SIGSEGV), three times in a day of
      test runs on a loaded 2-core machine, mostly with 3 ranks. There ``destroy_process_group()`` does
      not end the group's threads once ``torch.distributed.nn`` was first imported after
      ``init_process_group`` (DDP's constructor imports it, through ``torch._dynamo``): its functions'
      default argument ``group=group.WORLD`` keeps the group alive, so its threads still run as the
      interpreter exits (/proc/self/task: 4 threads after the destroy, 1 when it was imported before
      the init). The standalone ``ddp.py`` imports it first instead, and its test counts the threads.
    """
    if not dist.is_initialized():
        return
    if dist.get_backend() != "gloo":
        dist.destroy_process_group()
        return
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
