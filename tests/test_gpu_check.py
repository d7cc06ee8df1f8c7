"""`make gpu-check`: refuses without a GPU; its whole path runs at tiny sizes on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ddp_helpers.gpu_check import NO_GPU_EXIT


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_refuses_politely_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddp_helpers.gpu_check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == NO_GPU_EXIT
    assert "needs a CUDA GPU" in proc.stdout and "nothing was run" in proc.stdout
    assert not (tmp_path / "gpu-check.json").exists()


def test_cpu_smoke_writes_the_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddp_helpers.gpu_check", "--cpu-smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["allreduce"]["all_correct"]
    assert [r["name"] for r in report["training"]] == ["mlp-ws2-bf16"]
    assert all(r["samples_per_s"] > 0 for r in report["training"])
