"""Round trip of a trivial cell on live ranks, against `launch()` of the same code as a script.

    python benchmarks/bench_live_ranks.py [--cells 20] [--launches 3]

The cell is ``x = torch.ones(1); dist.all_reduce(x)`` on 2 CPU ranks (gloo). Live ranks pay for
torchrun and ``import torch`` once; a launch pays for them on every cell. Target: a median of at most
0.1 s per warm cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ddp_helpers import launch, start_ranks

CELL = "x = torch.ones(1); dist.all_reduce(x)"
SCRIPT = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1); dist.all_reduce(x)
dist.destroy_process_group()
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ranks = start_ranks(nproc=2, backend="gloo", run_dir=Path(tmp) / "ranks", show_ranks="none")
        start_s = time.perf_counter() - started
        cells = []
        with ranks:
            ranks.run(CELL)  # the first collective sets up gloo's connections
            for _ in range(args.cells):
                began = time.perf_counter()
                ranks.run(CELL)
                cells.append(time.perf_counter() - began)
        script = Path(tmp) / "cell.py"
        script.write_text(SCRIPT)
        launches = []
        for i in range(args.launches):
            began = time.perf_counter()
            launch(
                script,
                nproc=2,
                backend="gloo",
                run_dir=Path(tmp) / f"launch{i}",
                progress="off",
                show_ranks="none",
            )
            launches.append(time.perf_counter() - began)
    figures = {
        "start_ranks_s": start_s,
        "cell_median_s": statistics.median(cells),
        "cell_max_s": max(cells),
        "cells": args.cells,
        "launch_median_s": statistics.median(launches),
        "launches": args.launches,
    }
    print(
        f"live ranks: start {start_s:.2f}s, then a trivial cell takes {figures['cell_median_s'] * 1000:.1f} ms "
        f"(median of {args.cells}, max {figures['cell_max_s'] * 1000:.1f} ms; target <= 100 ms)\n"
        f"launch() of the same code: {figures['launch_median_s']:.2f}s (median of {args.launches}), "
        f"{figures['launch_median_s'] / figures['cell_median_s']:.0f}x a warm cell"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
