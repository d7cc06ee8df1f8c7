"""Training throughput per mode at a fixed workload, against a plain torchrun DDP script.

    python benchmarks/bench_training.py [--steps 30]

Workload (issue: "the worker must be fast"): ResNet-18, synthetic 3x32x32, batch 32 per rank,
2 ranks for DDP. The yardstick is benchmarks/reference_torchrun.py, a Trainer-style script in the
manner of pytorch/examples' multigpu_torchrun, run with bare torchrun.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ddp_helpers import launch
from ddp_helpers.metrics import read_summary
from ddp_helpers.workers import worker_path

REFERENCE = Path(__file__).with_name("reference_torchrun.py")


def worker_args(steps: int) -> list[str]:
    return ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--num-samples", "1024",
            "--batch-size", "32", "--steps", str(steps), "--warmup-steps", "5", "--log-every", "5"]  # fmt: skip


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
    result = launch(worker_path("train"), *worker_args(steps), nproc=2, run_dir=run_dir, progress="off",
                    show_ranks="none")  # fmt: skip
    return result.summary["samples_per_s"]


def reference(steps: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(REFERENCE),
           "--steps", str(steps), "--warmup", "5", "--batch-size", "32"]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = {
            "single (train.py, 1 process)": single(args.steps, Path(tmp) / "single"),
            "ddp (train.py via launch, 2 ranks)": ddp(args.steps, Path(tmp) / "ddp"),
            "reference torchrun script, 2 ranks": reference(args.steps),
        }
    for name, value in figures.items():
        print(f"{name:<38} {value:8.1f} samples/s")
    ratio = figures["ddp (train.py via launch, 2 ranks)"] / figures["reference torchrun script, 2 ranks"]
    print(f"train.py DDP / reference: {ratio:.3f} (>= 1 means the worker is at least as fast)")
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "ddp_over_reference": ratio}, indent=2))


if __name__ == "__main__":
    main()
