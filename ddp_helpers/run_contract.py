"""The contract between the kernel and the ranks: each rank's environment and a run folder's files
(logs/torchrun.log, logs/<id>/attempt_<k>/<local rank>/, logs/stacks/, metrics/rank<R>.jsonl, plan.json,
summary.json). Both sides import the names from here; it imports no torch."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "DDP_RUN_DIR"  # the run's folder: where the rank writes metrics/ and summary.json
BACKEND_ENV = "DDP_BACKEND"  # the backend launch chose ("auto" or unset: the worker's own rule)
DEVICE_ENV = "DDP_DEVICE"  # "cpu" or "cuda": "cpu" keeps a rank off GPUs it could see
STACK_DUMPS_ENV = "DDP_HELPERS_STACK_DUMPS"  # "1": the rank answers the launcher's stack requests

LOGS_DIR = "logs"
AGENT_LOG = "torchrun.log"  # in logs/
STACKS_DIR = "stacks"  # in logs/
METRICS_DIR = "metrics"
SUMMARY_FILE = "summary.json"
PLAN_FILE = "plan.json"
# what a new run into a used folder moves aside
RUN_OUTPUTS = (LOGS_DIR, METRICS_DIR, SUMMARY_FILE, PLAN_FILE)

# torchrun's own per-rank files (--redirects 3 --log-dir, and @record's TORCHELASTIC_ERROR_FILE)
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
ERROR_FILE = "error.json"


def run_dir_from_env(default: str) -> str:
    """The run folder the launcher gave this rank, or `default` when the script runs on its own."""
    return os.environ.get(RUN_DIR_ENV, default)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as JSON through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.errno == errno.ENOSPC:
            raise OSError(
                error.errno, f"no space left on the device that holds {path.parent}: cannot write {path.name}"
            ) from error
        raise
