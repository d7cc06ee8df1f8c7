"""`make gpu-check`: the doctor, the all_reduce bench, 08's calculator against the true peak, every notebook
and ResNet-50 training, on cuda/nccl.

    python scripts/gpu_check.py [--out DIR] [--deadline-s 420] [--notebooks '0*'] [--cpu-smoke]

One run, in this order, each part only while time is left before the deadline:
1. the static checks, each notebook's plan for this box (ddp_helpers/kernel/lab/plan_core: the backend, device
   and sizes its runs take here, and whether any run it compares leaves the GPUs), and a live
   all_reduce sweep;
   then notebook 08's memory calculator against each rank's true peak over one step
   (`torch.cuda.max_memory_allocated()`, reset before the step) for DDP and FSDP2, at the sizes 08's
   plan picks for this box: both numbers and their ratio;
2. every notebook with papermill in smoke mode, then every notebook at full size. A notebook
   still running at the deadline is interrupted, as Jupyter's stop button would (its launches stop
   their ranks). While a notebook runs, the GPU's process list is watched for the kernel: the
   kernel must never hold a CUDA context;
3. ResNet-50 training at 1..N GPUs with fp32, bf16 and fp16.

Writes gpu-check.json (timings, statuses, results) and notebooks.tar.gz (the executed notebooks)
under $OUT, or runs/gpu-check/; the runs' own files go to --work. Meant for a bare GPU machine
with torch and no internet: papermill and its dependencies travel as wheels (scripts/gpu_wheels.sh);
without them the notebooks are reported as not run and the rest still runs.
Refuses, with exit code 3, when no GPU is visible (--cpu-smoke: tiny sizes on the CPU instead).
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

from gpu_check_notebooks import KernelWatch, run_notebooks  # beside this file: stdlib only at import

REPO = Path(__file__).resolve().parent.parent
# The device machine runs this file with its own python, where the package is not installed: the
# repository goes on the path, for this process and for every worker it launches.
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

__all__ = ["NO_GPU_EXIT", "KernelWatch", "main"]

NO_GPU_EXIT = 3
NOTEBOOKS_DIR = REPO / "notebooks"
PARTS = ("checks", "plans", "allreduce", "memory", "notebooks", "mutants", "training")
HELD = ("parameters", "gradients", "optimizer", "activations")  # the calculator's kinds of memory


def _train(
    out: Path, world_size: int, amp: str, steps: int, batch: int, model: str, image: int
) -> dict[str, Any]:
    from ddp_helpers.errors import LaunchError
    from ddp_helpers.kernel.launcher.runner import launch
    from ddp_helpers.workers import worker_path

    name = f"{model}-ws{world_size}-{amp}"
    args: list[str | int] = [
        "--model",
        model,
        "--dataset",
        "synthetic",
        "--image-size",
        image,
        "--num-samples",
        512,
        "--batch-size",
        batch,
        "--steps",
        steps,
        "--log-every",
        5,
        "--warmup-steps",
        10,
        "--amp",
        amp,
    ]
    try:
        result = launch(
            worker_path("train"),
            *args,
            nproc=world_size,
            run_dir=out / name,
            timeout=180,
            show_ranks=0,
            progress="text",
        )
    except LaunchError as err:
        return {"name": name, "world_size": world_size, "amp": amp, "error": str(err).splitlines()[0]}
    return {"name": name, "wall_s": result.wall_s, **result.summary}


def memory_plan(gpus: int) -> dict[str, Any]:
    """The memory part's run: notebook 08's training job as its plan puts it on this box (ranks, backend,
    sizes, global batch), and the calculator's bytes for the fullest rank at the end of forward."""
    from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import Setup, predict
    from ddp_helpers.kernel.lab.plan_core import plan_for

    plan = plan_for("08", gpus, gpus or 2)
    run = plan.runs["train"]
    assert run.batch is not None, run  # the plan gives the training job a batch its ranks split
    width, depth, per_rank = plan.sizes["width"], plan.sizes["depth"], run.batch // run.world
    predicted = {}
    for strategy in ("ddp", "fsdp2"):  # fsdp_footprint.PEAK_STRATEGIES, without importing torch here
        setup = Setup(width=width, depth=depth, batch=per_rank, world=run.world, strategy=strategy)
        predicted[strategy] = max(sum(rank[k] for k in HELD) for rank in predict(setup))
    return {
        "nproc": run.nproc,
        "backend": run.backend,
        "env": dict(run.env),
        "device": run.device,
        "args": ["--part", "peak", "--width", width, "--depth", depth, "--global-batch", run.batch],
        "predicted": predicted,
    }


def memory_rows(predicted: dict[str, int], peaks: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """Per strategy: the calculator's end of forward, the fullest rank's measured peak, and their ratio."""
    rows = []
    for strategy, expected in predicted.items():
        measured = [rank["peak"] for rank in peaks.get(strategy, [])]
        peak = max(measured) if measured and None not in measured else None
        rows.append(
            {
                "strategy": strategy,
                "predicted_forward_end_bytes": expected,
                "measured_peak_bytes": peak,
                "peak_over_predicted": round(peak / expected, 3) if peak is not None else None,
            }
        )
    return rows


# ----------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-check", help="report files")
    parser.add_argument("--work", default="runs/gpu-check-work", help="the runs' own files")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=420,
        help="seconds for the whole check: parts not started by then are skipped, and a notebook "
        "still running is interrupted (420 s leaves a one-H200 run inside 8 minutes)",
    )
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument(
        "--notebooks", default="*", help="which notebooks, as a glob on their names ('0[06]*')"
    )
    parser.add_argument("--notebook-dir", default=str(NOTEBOOKS_DIR), help="where the notebooks are")
    parser.add_argument("--modes", default=None, help="smoke,full (default), or smoke with --cpu-smoke")
    parser.add_argument("--nproc", type=int, default=None, help="passed to every notebook (default: its own)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU")
    parser.add_argument("--max-bytes", type=int, default=1 << 30, help="largest all_reduce message")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny sizes on the CPU with gloo, to test this script where there is no GPU",
    )
    return parser


def make_plan(args: argparse.Namespace, parts: list[str], gpus: int) -> dict[str, Any]:
    """What this run covers: real sizes on every GPU, or tiny ones on the CPU (--cpu-smoke)."""
    if args.cpu_smoke:
        plan = {"world_sizes": [2], "amps": ["bf16"], "model": "mlp", "image": 32, "nproc": 2}
        args.steps, args.max_bytes = min(args.steps, 12), min(args.max_bytes, 1 << 16)
    else:
        plan = {
            "world_sizes": list(range(1, gpus + 1)),
            "amps": ["off", "bf16", "fp16"],
            "model": "resnet50",
            "image": 224,
            "nproc": gpus,
        }
    plan.update(
        parts=parts,
        modes=(args.modes or ("smoke" if args.cpu_smoke else "smoke,full")).split(","),
        notebooks=args.notebooks,
        deadline_s=args.deadline_s,
    )
    return plan


class GpuCheck:
    """The parts, run in order while time is left; the report is saved after each one."""

    def __init__(self, args: argparse.Namespace, plan: dict[str, Any], gpus: int, started: float) -> None:
        self.args, self.plan, self.gpus = args, plan, gpus
        self.started = started  # the deadline counts from the script's start, torch's import included
        self.deadline = self.started + args.deadline_s
        self.out, self.work = Path(args.out).resolve(), Path(args.work).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "plan": plan, "timings_s": {}}

    def save(self) -> None:  # after every part: a run cut short still leaves what it measured
        self.report["wall_s"] = round(time.time() - self.started, 1)
        (self.out / "gpu-check.json").write_text(json.dumps(self.report, indent=2, default=str))

    def run(self) -> None:
        for name in PARTS:
            if name not in self.plan["parts"]:
                continue
            if time.time() > self.deadline:
                self.report["timings_s"][name] = "skipped: time budget"
            else:
                t0 = time.time()
                getattr(self, name)()
                self.report["timings_s"][name] = round(time.time() - t0, 1)
            self.save()
        self.save()

    def checks(self) -> None:
        from ddp_helpers.kernel.lab.doctor import collect_facts, run_checks

        self.report["facts"] = collect_facts()
        self.report["checks"] = [asdict(c) for c in run_checks(self.report["facts"])]

    def plans(self) -> None:
        """Each notebook's plan for this box, as its notebook will compute it; a compared run off the GPUs
        on a box with a GPU for every rank is a planning error the notebooks' own runs would hide."""
        from ddp_helpers.kernel.lab.plan_core import plan_for, planners

        rows = []
        for notebook in planners():
            nproc = self.args.nproc or self.gpus or 2  # what chapter_setup chooses for nproc=None
            for smoke in sorted({mode == "smoke" for mode in self.plan["modes"]}, reverse=True):
                plan = plan_for(notebook, self.gpus, nproc, smoke=smoke)
                compared = sorted({name for group in plan.compared for name in group})
                off_gpu = [n for n in compared if plan.runs[n].device != "cuda"]
                rows.append(
                    {
                        "notebook": notebook,
                        "smoke": smoke,
                        "nproc": nproc,
                        "device": plan.device,
                        "line": plan.line,
                        "sizes": dict(plan.sizes),
                        "runs": {
                            n: {"nproc": r.nproc, "backend": r.backend, "device": r.device, "batch": r.batch}
                            for n, r in plan.runs.items()
                        },
                        "compared_off_gpu": off_gpu if self.gpus >= nproc else [],
                    }
                )
        self.report["plans"] = rows

    def allreduce(self) -> None:
        from ddp_helpers.chapters.ch00_environment.ch00_allreduce_check import live_allreduce

        found, self.report["allreduce"] = live_allreduce(
            nproc=self.plan["nproc"],
            max_bytes=self.args.max_bytes,
            iters=20,
            run_dir=self.work / "allreduce",
            progress="text",
        )
        self.report.setdefault("checks", []).extend(asdict(c) for c in found)

    def memory(self) -> None:
        """08's calculator against torch.cuda.max_memory_allocated() over one step, per strategy."""
        from ddp_helpers.errors import LaunchError
        from ddp_helpers.kernel.launcher.runner import launch
        from ddp_helpers.workers import worker_path

        run = memory_plan(self.gpus)
        if self.gpus == 0:  # --cpu-smoke: the CPU has no allocator peak to compare with
            self.report["memory"] = {"status": "not run: max_memory_allocated needs a GPU", **run}
            return
        try:
            result = launch(
                worker_path("fsdp"),
                *run["args"],
                nproc=run["nproc"],
                backend=run["backend"],
                env=run["env"],
                run_dir=self.work / "memory",
                timeout=300,
                show_ranks=0,
                progress="text",
            )
        except LaunchError as err:
            self.report["memory"] = {**run, "error": str(err).splitlines()[0]}
            return
        self.report["memory"] = {**run, "rows": memory_rows(run["predicted"], result.summary["peaks"])}

    def notebooks(self) -> None:
        self.report["notebooks"] = run_notebooks(
            Path(self.args.notebook_dir),
            self.args.notebooks,
            self.plan["modes"],
            self.work,
            self.out,
            self.deadline,
            self.gpus > 0,
            self.args.nproc,
        )

    def mutants(self) -> None:
        """The mutants a CPU cannot kill (CUDA-only lines), each run on the notebook that teaches it."""
        import subprocess

        if self.gpus == 0:  # --cpu-smoke: these mutants survive a CPU by definition
            self.report["mutants"] = {"status": "not run: they need a GPU"}
            return
        left = int(self.deadline - time.time())
        command = [sys.executable, str(REPO / "mutants" / "run.py"), "--gpu", "--jobs", "1"]
        proc = subprocess.run(
            [*command, "--timeout", str(max(60, left)), "--report", str(self.out)],
            capture_output=True,
            text=True,
        )
        report = self.out / "mutants.json"
        self.report["mutants"] = {
            "exit": proc.returncode,
            "runs": json.loads(report.read_text()) if report.exists() else [],
            "output_tail": (proc.stdout + proc.stderr)[-2000:],
        }

    def training(self) -> None:
        plan, runs = self.plan, self.report.setdefault("training", [])
        for world_size in plan["world_sizes"]:
            for amp in plan["amps"]:
                if time.time() > self.deadline:
                    runs.append({"world_size": world_size, "amp": amp, "status": "skipped: time budget"})
                    continue
                args = self.args
                run = _train(
                    self.work, world_size, amp, args.steps, args.batch_size, plan["model"], plan["image"]
                )
                runs.append(run)
                print(
                    json.dumps({k: run.get(k) for k in ("name", "samples_per_s", "peak_mem_bytes", "error")})
                )
                self.save()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        _parser().error(f"unknown parts: {', '.join(sorted(set(parts) - set(PARTS)))}")
    started = time.time()

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    plan = make_plan(args, parts, gpus)
    if gpus == 0 and not args.cpu_smoke:
        print(
            "gpu-check needs a CUDA GPU and this machine has none visible: nothing was run.\n"
            "On the CPU, run `make test` or `python -m ddp_helpers doctor` instead."
        )
        return NO_GPU_EXIT
    check = GpuCheck(args, plan, gpus, started)
    check.run()
    print(f"wrote {check.out / 'gpu-check.json'} in {check.report['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
