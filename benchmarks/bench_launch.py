"""Wall time of `launch()` against bare torchrun, on two 2-rank jobs.

    python benchmarks/bench_launch.py [--repeats 7] [--chatty-lines 50000]

- trivial: init, one all_reduce, tear down. Target: ratio <= 1.15.
- chatty: each rank prints 50,000 lines as fast as it can. Bare torchrun writes them to files
  (``--redirects 3 --log-dir``); launch() keeps every line too (files and result.logs) and shows a
  bounded view in the cell (stdout goes to /dev/null here). Target: ratio <= 1.5.

Runs alternate (bare, launch, bare, ...) so that drift in machine load hits both sides alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_helpers import launch

JOB = Path(__file__).with_name("trivial_job.py")
CHATTY = Path(__file__).with_name("chatty_job.py")


def bare_torchrun(job: Path, args: list[str], log_dir: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(log_dir),
            "--redirects",
            "3",
            str(job),
            *args,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def with_launch(job: Path, args: list[str], run_dir: Path, show_ranks: str) -> float:
    started = time.perf_counter()
    with (
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
        contextlib.redirect_stderr(devnull),
    ):
        result = launch(
            job, *args, nproc=2, backend="gloo", run_dir=run_dir, progress="off", show_ranks=show_ranks
        )
    elapsed = time.perf_counter() - started
    if args:  # the chatty job: every line kept
        assert all(len(lines) >= int(args[0]) for lines in result.logs.values()), "lines were lost"
    return elapsed


def compare(name: str, job: Path, args: list[str], show_ranks: str, repeats: int, tmp: Path) -> dict:
    bare, launched = [], []
    bare_torchrun(job, args, tmp / f"{name}-warm")  # warm the file cache for both sides
    for i in range(repeats):
        bare.append(bare_torchrun(job, args, tmp / f"{name}-bare{i}"))
        launched.append(with_launch(job, args, tmp / f"{name}-run{i}", show_ranks))
        print(f"{name} run {i + 1}/{repeats}: bare {bare[-1]:.2f}s  launch {launched[-1]:.2f}s", flush=True)
    figures = {
        "bare_torchrun_median_s": statistics.median(bare),
        "launch_median_s": statistics.median(launched),
    }
    figures["ratio"] = figures["launch_median_s"] / figures["bare_torchrun_median_s"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chatty-lines", type=int, default=50_000, help="lines per rank in the chatty job")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    targets = {"trivial": 1.15, "chatty": 1.5}
    with tempfile.TemporaryDirectory() as tmp:
        figures = {
            "repeats": args.repeats,
            "trivial": compare("trivial", JOB, [], "none", args.repeats, Path(tmp)),
            "chatty": compare("chatty", CHATTY, [str(args.chatty_lines)], "all", args.repeats, Path(tmp)),
        }
    for name, target in targets.items():
        f = figures[name]
        print(
            f"{name}: bare torchrun median {f['bare_torchrun_median_s']:.2f}s, launch() median "
            f"{f['launch_median_s']:.2f}s, ratio {f['ratio']:.3f} (target <= {target})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
