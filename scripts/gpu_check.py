"""`make gpu-check`: the doctor, the all_reduce bench, every notebook and ResNet-50 training, on cuda/nccl.

    python scripts/gpu_check.py [--out DIR] [--deadline-s 420] [--notebooks '0*'] [--cpu-smoke]

One run, in this order, each part only while time is left before the deadline:
1. the static checks and a live all_reduce sweep;
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
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The device machine runs this file with its own python, where the package is not installed: the
# repository goes on the path, for this process and for every worker it launches.
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

NO_GPU_EXIT = 3
NOTEBOOKS_DIR = REPO / "notebooks"
PARTS = ("checks", "allreduce", "notebooks", "training")


def _train(
    out: Path, world_size: int, amp: str, steps: int, batch: int, model: str, image: int
) -> dict[str, Any]:
    from ddp_helpers.errors import LaunchError
    from ddp_helpers.launcher.runner import launch
    from ddp_helpers.workers import worker_path

    name = f"{model}-ws{world_size}-{amp}"
    args = [
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


# -------------------------------------------------------------------------------------- notebooks
class KernelWatch:
    """While a notebook runs: interrupt its kernel at the deadline, and look for it among the GPU's processes.

    The kernel is the ``ipykernel`` process papermill starts under this one. SIGINT is what Jupyter's
    interrupt sends: the running cell gets KeyboardInterrupt, and `launch()` stops its ranks.
    """

    def __init__(self, deadline: float, gpus: bool, poll_s: float = 0.5) -> None:
        self.deadline, self.gpus, self.poll_s = deadline, gpus, poll_s
        self.interrupted = False
        self.kernel_pids: set[int] = set()
        self.gpu_pids_seen: set[int] = set()  # this run's processes (ranks, kernel) seen with a CUDA context
        self.kernel_with_cuda: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KernelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def result(self) -> dict[str, Any]:
        if not self.gpus:
            cuda = "not checked: no GPU"
        elif not self.gpu_pids_seen:
            # the ranks hold contexts: if none of them was ever listed, the list cannot be read from here
            cuda = (
                "unknown: none of this run's processes was listed on the GPU (no process list, or other pids)"
            )
        else:
            cuda = bool(self.kernel_with_cuda)
        return {"kernel_cuda_context": cuda, "gpu_processes_seen": len(self.gpu_pids_seen)}

    def _processes(self) -> tuple[set[int], set[int]]:
        """(kernel pids, every pid below this process): the ranks, in sessions of their own, stay below."""
        import psutil

        kernels, everyone = set(), set()
        for child in psutil.Process().children(recursive=True):
            everyone.add(child.pid)
            try:
                if any("ipykernel" in part for part in child.cmdline()):
                    kernels.add(child.pid)
            except psutil.Error:
                continue
        return kernels, everyone

    def _run(self) -> None:
        last_interrupt = 0.0
        while not self._stop.wait(self.poll_s):
            kernels, everyone = self._processes()
            self.kernel_pids |= kernels
            now = time.time()
            if now > self.deadline and kernels and now - last_interrupt > 10:
                for pid in kernels:
                    os.kill(pid, signal.SIGINT)
                self.interrupted, last_interrupt = True, now
            if self.gpus:
                with_cuda = gpu_process_ids()
                if with_cuda is not None:
                    self.gpu_pids_seen |= everyone & with_cuda
                    self.kernel_with_cuda |= kernels & with_cuda


def gpu_process_ids() -> set[int] | None:
    """Processes holding a CUDA context on any GPU (NVML, else nvidia-smi); None if neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            pids = set()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            return pids
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, or NVML without a process list: ask nvidia-smi
        pass
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {int(line) for line in proc.stdout.split() if line.strip().isdigit()}


def _first_line(err: Exception) -> str:
    """The cell's exception, as "Type: first line" (papermill's own message ends with a log path)."""
    name, value = getattr(err, "ename", None), getattr(err, "evalue", None)  # PapermillExecutionError
    if name:
        cell = getattr(err, "exec_count", None)
        return f"{name}: {(value or '').strip().splitlines()[0] if (value or '').strip() else ''} (cell [{cell}])"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def run_notebook(
    notebook: Path, mode: str, work: Path, deadline: float, gpus: bool, parameters: dict[str, Any]
) -> dict[str, Any]:
    """Execute one notebook with papermill in `work`; its outcome, wall time and the CUDA-context check."""
    import papermill

    row: dict[str, Any] = {"notebook": notebook.stem, "mode": mode, "parameters": parameters}
    left = deadline - time.time()
    if left < 10:
        return {**row, "status": "skipped: time budget"}
    folder = work / f"{notebook.stem}-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ.update(DDP_HELPERS_PROGRESS="text", DDP_HELPERS_RUNS_DIR=str(folder / "runs"))
    started = time.time()
    with KernelWatch(deadline, gpus) as watch:
        try:
            papermill.execute_notebook(
                str(notebook),
                str(work / "executed" / f"{notebook.stem}-{mode}.ipynb"),
                parameters=parameters,
                cwd=str(folder),
                kernel_name="python3",
                progress_bar=False,
                execution_timeout=int(left) + 1,
            )
            status, error = "ok", None
        except Exception as err:  # a failing notebook is a finding, not the end of the check
            status = "stopped: time budget" if watch.interrupted else "failed"
            error = _first_line(err)
    return {
        **row,
        "status": status,
        "wall_s": round(time.time() - started, 1),
        "error": error,
        **watch.result(),
    }


def run_notebooks(
    folder: Path,
    pattern: str,
    modes: list[str],
    work: Path,
    out: Path,
    deadline: float,
    gpus: bool,
    nproc: int | None,
) -> list[dict[str, Any]]:
    """Every notebook matching `pattern`, in each mode (all smoke runs first); archives the executed ones."""
    try:
        import papermill  # noqa: F401
    except ImportError:
        return [{"status": "not run: papermill is not installed (carry its wheels: scripts/gpu_wheels.sh)"}]
    notebooks = [nb for nb in sorted(folder.glob("[0-9][0-9]_*.ipynb")) if fnmatch.fnmatch(nb.stem, pattern)]
    (work / "executed").mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in modes:
        for notebook in notebooks:
            parameters: dict[str, Any] = {"smoke": mode == "smoke"}
            if nproc is not None:
                parameters["nproc"] = nproc
            row = run_notebook(notebook, mode, work, deadline, gpus, parameters)
            print(
                json.dumps(
                    {k: row.get(k) for k in ("notebook", "mode", "status", "wall_s", "kernel_cuda_context")}
                ),
                flush=True,
            )
            rows.append(row)
    with tarfile.open(out / "notebooks.tar.gz", "w:gz") as archive:  # one file: $OUT returns few
        archive.add(work / "executed", arcname="executed")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        _parser().error(f"unknown parts: {', '.join(sorted(set(parts) - set(PARTS)))}")
    started = time.time()
    deadline = started + args.deadline_s

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
    if gpus == 0 and not args.cpu_smoke:
        print(
            "gpu-check needs a CUDA GPU and this machine has none visible: nothing was run.\n"
            "On the CPU, run `make test` or `python -m ddp_helpers doctor` instead."
        )
        return NO_GPU_EXIT

    from ddp_helpers.lab.allreduce_check import live_allreduce
    from ddp_helpers.lab.doctor import collect_facts, run_checks

    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "plan": plan, "timings_s": {}}

    def save() -> None:  # after every part: a run cut short still leaves what it measured
        report["wall_s"] = round(time.time() - started, 1)
        (out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))

    def part(name: str, run) -> None:
        if name not in parts:
            return
        if time.time() > deadline:
            report["timings_s"][name] = "skipped: time budget"
        else:
            t0 = time.time()
            run()
            report["timings_s"][name] = round(time.time() - t0, 1)
        save()

    def checks() -> None:
        report["facts"] = collect_facts()
        report["checks"] = [asdict(c) for c in run_checks(report["facts"])]

    def allreduce() -> None:
        found, report["allreduce"] = live_allreduce(
            nproc=plan["nproc"],
            max_bytes=args.max_bytes,
            iters=20,
            run_dir=work / "allreduce",
            progress="text",
        )
        report.setdefault("checks", []).extend(asdict(c) for c in found)

    def notebooks() -> None:
        report["notebooks"] = run_notebooks(
            Path(args.notebook_dir), args.notebooks, plan["modes"], work, out, deadline, gpus > 0, args.nproc
        )

    def training() -> None:
        report["training"] = []
        for world_size in plan["world_sizes"]:
            for amp in plan["amps"]:
                if time.time() > deadline:
                    report["training"].append(
                        {"world_size": world_size, "amp": amp, "status": "skipped: time budget"}
                    )
                    continue
                run = _train(work, world_size, amp, args.steps, args.batch_size, plan["model"], plan["image"])
                report["training"].append(run)
                print(
                    json.dumps({k: run.get(k) for k in ("name", "samples_per_s", "peak_mem_bytes", "error")})
                )
                save()

    for name, run in (
        ("checks", checks),
        ("allreduce", allreduce),
        ("notebooks", notebooks),
        ("training", training),
    ):
        part(name, run)
    save()
    print(f"wrote {out / 'gpu-check.json'} in {report['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
