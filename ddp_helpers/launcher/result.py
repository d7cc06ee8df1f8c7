"""`LaunchResult`: what a finished launch left, as `launch` returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def _empty_frame() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame()


@dataclass
class LaunchResult:
    """What a finished run left: exit code, timing, logs, metrics and the rank-0 summary."""

    returncode: int
    wall_s: float
    run_dir: Path
    logs: dict[int, list[str]]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    command: list[str]
    # what the run's processes got on top of this process's environment (OMP_NUM_THREADS, PYTHONPATH, ...)
    environment: dict[str, str] = field(default_factory=dict)
    launcher_output: list[str] = field(default_factory=list)
    attempts: int = 1
    resources: pd.DataFrame = field(default_factory=_empty_frame)  # per-rank CPU/RSS, per-GPU use, over time
    gpu_sampling: str = "not requested"  # "sampled", or why not ("not sampled: ...")
    lines_held_back: int = 0  # lines not echoed into the cell (all are in `logs` and on disk)
    # how torchrun's agent started: "forked" from the agent server (it imported no torch of its own),
    # "fresh" (a new interpreter: no server here, or it was turned off), or "none" (launcher="python")
    agent: str = "none"
    agent_wait_s: float = 0.0  # launch()'s wait for the fork (a cold server: the rest of its import)

    def log(self, rank: int) -> str:
        """Every line rank `rank` printed, stdout and stderr, in the order they were read."""
        return "\n".join(self.logs.get(rank, []))

    def __repr__(self) -> str:
        return (
            f"LaunchResult(returncode={self.returncode}, wall_s={self.wall_s:.2f}, ranks={sorted(self.logs)}, "
            f"metrics_rows={len(self.metrics)}, run_dir='{self.run_dir}')"
        )
