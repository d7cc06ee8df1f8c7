"""The notebooks part of `make gpu-check` (scripts/gpu_check.py): papermill runs, watched for a kernel CUDA context.

Each notebook runs in smoke mode, then at full size, until the deadline; a notebook still running at
the deadline is interrupted as Jupyter's stop button would. While one runs, the GPU's process list is
watched for the kernel: the kernel must never hold a CUDA context.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any


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
        cuda: str | bool  # whether the kernel held a CUDA context, or why that is not known
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
            parameters: dict[str, Any] = {"smoke": mode == "smoke", "solutions": True}
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
