"""Training throughput per mode at a fixed workload, against a plain torchrun DDP script.

    python benchmarks/bench_training.py [--steps 30] [--repeats 3]

Workload (issue: "the worker must be fast"): ResNet-18, synthetic 3x32x32, batch 32 per rank,
2 ranks for DDP. The yardstick is benchmarks/reference_torchrun.py, a Trainer-style script in the
manner of pytorch/examples' multigpu_torchrun, run with bare torchrun.

Each figure is the median of `--repeats` runs, interleaved so that a slow minute on the machine
hits every setup alike; the spread, (max - min) / median, says how much a gap between two figures
can be trusted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ddp_helpers import launch, read_summary
from ddp_helpers.workers import worker_path

REFERENCE = Path(__file__).with_name("reference_torchrun.py")


def worker_args(steps: int) -> list[str]:
    return [
        "--model",
        "resnet18",
        "--dataset",
        "synthetic",
        "--image-size",
        "32",
        "--num-samples",
        "1024",
        "--batch-size",
        "32",
        "--steps",
        str(steps),
        "--warmup-steps",
        "5",
        "--log-every",
        "5",
    ]


def single(steps: int, run_dir: Path) -> float:
    cmd = [
        sys.executable,
        str(worker_path("train")),
        "--mode",
        "single",
        *worker_args(steps),
        "--run-dir",
        str(run_dir),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return read_summary(run_dir)["samples_per_s"]


def ddp(steps: int, run_dir: Path) -> float:
    result = launch(
        worker_path("train"), *worker_args(steps), nproc=2, run_dir=run_dir, progress="off", show_ranks="none"
    )
    return result.summary["samples_per_s"]


def reference(steps: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REFERENCE),
        "--steps",
        str(steps),
        "--warmup",
        "5",
        "--batch-size",
        "32",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def spread(values: list[float]) -> float:
    """(max - min) / median: the run-to-run noise of one setup."""
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setup (the median is reported)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    setups = {
        "single (train.py, 1 process)": lambda tmp: single(args.steps, tmp / "single"),
        "ddp (train.py via launch, 2 ranks)": lambda tmp: ddp(args.steps, tmp / "ddp"),
        "reference torchrun script, 2 ranks": lambda tmp: reference(args.steps),
    }
    runs: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.repeats):
        for name, measure in setups.items():
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(measure(Path(tmp)))
    figures = {name: statistics.median(values) for name, values in runs.items()}
    for name, values in runs.items():
        print(
            f"{name:<38} {figures[name]:8.1f} samples/s  (median of {len(values)}, spread {spread(values):.1%})"
        )
    ratio = figures["ddp (train.py via launch, 2 ranks)"] / figures["reference torchrun script, 2 ranks"]
    noise = max(spread(values) for values in runs.values())
    print(f"train.py DDP / reference: {ratio:.3f} (>= 1 means the worker is at least as fast)")
    if args.repeats > 1:
        verdict = "larger" if abs(ratio - 1) > noise else "not larger"
        print(f"the gap to 1.0 is {verdict} than the largest run-to-run spread ({noise:.1%})")
    if args.json:
        report = {**figures, "ddp_over_reference": ratio, "runs": runs, "max_spread": noise}
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
