"""`make gpu-check`: the doctor, the all_reduce bench and ResNet-50 training at real sizes on cuda/nccl.

    python -m ddp_helpers.gpu_check [--out DIR] [--steps 40]

Writes gpu-check.json (and every run's files) under $OUT, or runs/gpu-check/. Meant for a
bare GPU machine with torch and no internet: it needs nothing but this package's own files.
Refuses, with exit code 3, when no GPU is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

NO_GPU_EXIT = 3


def _train(
    out: Path, world_size: int, amp: str, steps: int, batch: int, model: str, image: int
) -> dict[str, Any]:
    from .errors import LaunchError
    from .launch import launch
    from .workers import worker_path

    name = f"{model}-ws{world_size}-{amp}"
    args = ["--model", model, "--dataset", "synthetic", "--image-size", image, "--num-samples", 512,
            "--batch-size", batch, "--steps", steps, "--log-every", 5, "--warmup-steps", 10, "--amp", amp]  # fmt: skip
    try:
        result = launch(worker_path("train"), *args, nproc=world_size, run_dir=out / name, timeout=180,
                        show_ranks=0, progress="text")  # fmt: skip
    except LaunchError as err:
        return {"name": name, "world_size": world_size, "amp": amp, "error": str(err).splitlines()[0]}
    return {"name": name, "wall_s": result.wall_s, **result.summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-check")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU")
    parser.add_argument("--max-bytes", type=int, default=1 << 30, help="largest all_reduce message")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny sizes on the CPU with gloo, to test this script where there is no GPU")  # fmt: skip
    args = parser.parse_args(argv)

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.cpu_smoke:
        plan = {"world_sizes": [2], "amps": ["bf16"], "model": "mlp", "image": 32, "nproc": 2}
        args.steps, args.max_bytes = min(args.steps, 12), min(args.max_bytes, 1 << 16)
    else:
        plan = {"world_sizes": list(range(1, gpus + 1)), "amps": ["off", "bf16", "fp16"], "model": "resnet50",
                "image": 224, "nproc": gpus}  # fmt: skip
    if gpus == 0 and not args.cpu_smoke:
        print("gpu-check needs a CUDA GPU and this machine has none visible: nothing was run.\n"
              "On the CPU, run `make test` or `python -m ddp_helpers doctor` instead.")  # fmt: skip
        return NO_GPU_EXIT

    from .environment import collect_facts, live_allreduce, run_checks

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "plan": plan, "facts": collect_facts()}
    report["checks"] = [asdict(c) for c in run_checks(report["facts"])]
    checks, allreduce = live_allreduce(
        nproc=plan["nproc"], max_bytes=args.max_bytes, iters=20, run_dir=out / "allreduce"
    )
    report["checks"] += [asdict(c) for c in checks]
    report["allreduce"] = allreduce
    report["training"] = []
    for world_size in plan["world_sizes"]:
        for amp in plan["amps"]:
            run = _train(out, world_size, amp, args.steps, args.batch_size, plan["model"], plan["image"])
            report["training"].append(run)
            print(json.dumps({k: run.get(k) for k in ("name", "samples_per_s", "peak_mem_bytes", "error")}))
            (out / "gpu-check.json").write_text(
                json.dumps(report, indent=2, default=str)
            )  # keep what we have
    report["wall_s"] = time.time() - started
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out / 'gpu-check.json'} in {report['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
