"""What a rank writes while it trains: one JSONL file per rank, a plan and a summary."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ddp_helpers.run_contract import METRICS_DIR, PLAN_FILE, SUMMARY_FILE, run_dir_from_env
from ddp_helpers.run_contract import write_json_atomic as _write_json_atomic


class MetricsWriter:
    """Appends one JSON object per logged step to ``<run_dir>/metrics/rank{R}.jsonl``."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        metrics_dir = self.run_dir / METRICS_DIR
        metrics_dir.mkdir(parents=True, exist_ok=True)
        self.path = metrics_dir / f"rank{rank}.jsonl"
        self._fh = open(self.path, "a", buffering=1)  # line-buffered: the launcher tails it live

    def log(self, **fields: Any) -> None:
        record = {"rank": self.rank, "time": time.time(), **fields}
        self._fh.write(json.dumps(record) + "\n")

    def write_plan(self, total_steps: int, **fields: Any) -> None:
        """Tell the launcher how many steps to expect (rank 0 only), for the progress bar."""
        if self.rank == 0:
            _write_json_atomic(self.run_dir / PLAN_FILE, {"total_steps": total_steps, **fields})

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.rank == 0:
            _write_json_atomic(self.run_dir / SUMMARY_FILE, summary)

    def close(self) -> None:
        self._fh.close()


def report(rank: int, world: int, **facts: object) -> None:
    """Gather `facts` from every rank; rank 0 writes them, as a list by rank, to the run's summary.json."""
    import torch.distributed as dist  # here, not at the top: the metrics writer imports no torch

    gathered: list[dict[str, object] | None] = [None] * world
    dist.all_gather_object(gathered, facts)  # every rank must take part
    if rank == 0:
        run_dir = Path(run_dir_from_env("runs/demo"))
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"world_size": world, "backend": dist.get_backend(), "ranks": gathered}
        _write_json_atomic(run_dir / SUMMARY_FILE, summary)  # the notebook never sees half a file
