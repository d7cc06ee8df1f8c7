"""Wall time of `launch()` against bare torchrun on the same trivial 2-rank job.

    python benchmarks/bench_launch.py [--repeats 7]

Runs alternate (bare, launch, bare, ...) so that drift in machine load hits both sides alike.
Prints both medians and their ratio; the target is ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_helpers import launch

JOB = Path(__file__).with_name("trivial_job.py")


def bare_torchrun() -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - started


def with_launch(run_dir: Path) -> float:
    started = time.perf_counter()
    launch(JOB, nproc=2, backend="gloo", run_dir=run_dir, progress="off", show_ranks="none")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    bare, launched = [], []
    with tempfile.TemporaryDirectory() as tmp:
        bare_torchrun()  # warm the file cache for both sides
        for i in range(args.repeats):
            bare.append(bare_torchrun())
            launched.append(with_launch(Path(tmp) / f"run{i}"))
            print(f"run {i + 1}/{args.repeats}: bare {bare[-1]:.2f}s  launch {launched[-1]:.2f}s", flush=True)
    figures = {
        "bare_torchrun_median_s": statistics.median(bare),
        "launch_median_s": statistics.median(launched),
        "repeats": args.repeats,
    }
    figures["ratio"] = figures["launch_median_s"] / figures["bare_torchrun_median_s"]
    print(f"bare torchrun median {figures['bare_torchrun_median_s']:.2f}s, launch() median "
          f"{figures['launch_median_s']:.2f}s, ratio {figures['ratio']:.3f} (target <= 1.15)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
