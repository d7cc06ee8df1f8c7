"""`make gpu-check`: refuses without a GPU; its whole path runs at tiny sizes on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat
import pytest
import torch
from gpu_check import NO_GPU_EXIT, KernelWatch  # scripts/, on pytest's pythonpath

GPU_CHECK = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def _gpu_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_refuses_politely_without_a_gpu(tmp_path):
    proc = _gpu_check("--out", str(tmp_path), timeout=60)
    assert proc.returncode == NO_GPU_EXIT
    assert "needs a CUDA GPU" in proc.stdout and "nothing was run" in proc.stdout
    assert not (tmp_path / "gpu-check.json").exists()


@pytest.mark.notebooks
@pytest.mark.timeout(600)
def test_cpu_smoke_writes_the_report_and_the_executed_notebook(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # a notebook of two cells: the real chapters run under papermill in test_notebooks.py
    folder = _notebook_folder(tmp_path, "00_environment_check", "print('ran with smoke =', smoke)")
    proc = _gpu_check(
        "--cpu-smoke",
        "--notebook-dir",
        str(folder),
        "--notebooks",
        "00_*",
        "--out",
        str(out),
        "--work",
        str(work),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["allreduce"]["all_correct"]
    assert [r["name"] for r in report["training"]] == ["mlp-ws2-bf16"]
    assert all(r["samples_per_s"] > 0 for r in report["training"])
    (row,) = report["notebooks"]
    assert (row["notebook"], row["mode"], row["status"]) == ("00_environment_check", "smoke", "ok"), row
    assert (
        row["parameters"] == {"smoke": True, "solutions": True}
        and row["kernel_cuda_context"] == "not checked: no GPU"
    )
    assert set(report["timings_s"]) == {
        "checks",
        "plans",
        "allreduce",
        "memory",
        "notebooks",
        "mutants",
        "training",
    }
    assert report["memory"]["status"] == "not run: max_memory_allocated needs a GPU"
    plans = {(row["notebook"], row["smoke"]): row for row in report["plans"]}
    assert ("02", True) in plans and plans[("02", True)]["device"] == "cpu", sorted(
        plans
    )  # no GPU: the CPU plan
    assert report["mutants"] == {"status": "not run: they need a GPU"}  # CPU-unkillable ones, by definition
    with tarfile.open(out / "notebooks.tar.gz") as archive:
        member = archive.extractfile("executed/00_environment_check-smoke.ipynb")
        assert member is not None, "the executed notebook is no regular file"
        executed = member.read()
    nb = nbformat.reads(executed.decode(), as_version=4)
    assert any("ran with smoke = True" in str(cell.get("outputs")) for cell in nb.cells)  # it really ran
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "notebooks.tar.gz"]  # few files: $OUT


def _notebook_folder(tmp_path: Path, name: str, code: str) -> Path:
    """A folder holding one notebook: a `parameters` cell with `smoke`, then `code`."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("smoke = False", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(code),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


def test_a_notebook_still_running_at_the_deadline_is_interrupted(tmp_path):
    folder = _notebook_folder(tmp_path, "99_sleeps", "import time\ntime.sleep(600)")
    proc = _gpu_check(
        "--cpu-smoke",
        "--parts",
        "notebooks",
        "--notebook-dir",
        str(folder),
        "--modes",
        "smoke,full",
        "--deadline-s",
        "30",  # the kernel starts within it, under load too (20 was too short); the 600 s cell runs past it
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    statuses = [(r["mode"], r["status"]) for r in report["notebooks"]]
    assert statuses == [("smoke", "stopped: time budget"), ("full", "skipped: time budget")], report[
        "notebooks"
    ]
    assert report["notebooks"][0]["error"].startswith(("KeyboardInterrupt", "DeadKernelError"))


def test_unknown_parts_are_refused(tmp_path):
    proc = _gpu_check("--cpu-smoke", "--parts", "checks,bogus", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "unknown parts: bogus" in proc.stderr


def test_kernel_watch_says_unknown_unless_the_gpu_lists_this_runs_processes():
    watch = KernelWatch(deadline=0, gpus=True)
    assert watch.result()["kernel_cuda_context"].startswith("unknown")  # nothing listed: cannot tell
    watch.gpu_pids_seen = {101}  # a rank was listed, the kernel was not
    assert watch.result()["kernel_cuda_context"] is False
    watch.kernel_with_cuda = {100}
    assert watch.result() == {"kernel_cuda_context": True, "gpu_processes_seen": 1}
    assert KernelWatch(deadline=0, gpus=False).result()["kernel_cuda_context"] == "not checked: no GPU"


def test_the_plans_part_records_each_notebooks_plan_for_an_eight_gpu_box(tmp_path):
    """On 8 GPUs every notebook's compared runs stay on the GPUs (pure: no GPU needed to plan for one)."""
    import argparse

    from gpu_check import GpuCheck

    args = argparse.Namespace(
        nproc=None, out=str(tmp_path / "out"), work=str(tmp_path / "work"), deadline_s=60
    )
    check = GpuCheck(args, {"modes": ["smoke", "full"], "parts": ["plans"]}, gpus=8, started=0.0)
    check.plans()
    rows = check.report["plans"]
    assert {row["smoke"] for row in rows} == {True, False}
    assert {row["notebook"] for row in rows} >= {"02"}
    assert all(row["nproc"] == 8 and row["compared_off_gpu"] == [] for row in rows), rows
    assert next(row for row in rows if row["notebook"] == "02")["device"] == "cuda"
