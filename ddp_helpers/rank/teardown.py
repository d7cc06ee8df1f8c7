"""A worker's last step: tear the process group down, without the hangs and aborts gloo can hit."""

from __future__ import annotations

import os
import sys
import traceback

import torch.distributed as dist


def destroy_process_group() -> None:
    """``dist.destroy_process_group()``, where it is safe; a no-op when no group was started."""
    # On gloo the destroy is skipped and the process leaves with os._exit (Python's own exit code): no C++
    # destructor of the group runs, which is where gloo hung (torch 2.7) or aborted the exit (2.7 and 2.14,
    # SIGABRT; docs/torch-versions.md). Workers call this in a `finally`, after @record wrote the error.
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
