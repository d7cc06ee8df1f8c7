"""The doctor's live check: a real all_reduce over the ranks this machine runs, launched as a job."""

from __future__ import annotations

import os
from typing import Any

from ddp_helpers.errors import InvalidLaunchArguments, LaunchError
from ddp_helpers.kernel.lab.doctor import FAIL, INFO, PASS, Check
from ddp_helpers.kernel.launcher.runner import launch
from ddp_helpers.workers import worker_path


def live_allreduce(
    nproc: int | None = None,
    max_bytes: int = 1 << 24,
    iters: int = 10,
    run_dir: str | os.PathLike[str] | None = None,
    progress: str = "auto",
    timeout: float = 120,
) -> tuple[list[Check], dict[str, Any]]:
    """Run allreduce_bench.py (this chapter's script) through `launch` and turn it into checks plus the raw summary."""
    try:
        result = launch(
            worker_path("allreduce_bench"),
            "--max-bytes",
            max_bytes,
            "--iters",
            iters,
            nproc=nproc,
            run_dir=run_dir,
            progress=progress,
            timeout=timeout,
            show_ranks="none",
        )
    except InvalidLaunchArguments as err:
        advice = "nothing was started: change the argument this names (--no-live skips the live check)"
        return [Check("all_reduce (live)", FAIL, str(err).splitlines()[0], advice)], {}
    except LaunchError as err:
        # the ranks were not echoed (show_ranks="none"): say where their output is, not "above"
        logs = getattr(err, "run_dir", None)
        advice = f"every rank's output is under {logs}/logs" if logs else " ".join(str(err).splitlines()[1:4])
        return [Check("all_reduce (live)", FAIL, str(err).splitlines()[0], advice)], {}
    summary = result.summary
    n = summary["world_size"]
    correct = summary["all_correct"]
    best = max(summary["results"], key=lambda r: r["busbw_gbps"])
    checks = [
        Check(
            "all_reduce sum (live)",
            PASS if correct else FAIL,
            f"{n} ranks on {summary['backend']}: {'correct on every rank' if correct else 'WRONG on some rank'}",
        ),
        Check(
            "all_reduce busbw (live)",
            INFO,
            f"{best['busbw_gbps']:.3f} GB/s peak at {best['bytes']:,} B ({summary['backend']}, {n} ranks)",
        ),
    ]
    return checks, summary
