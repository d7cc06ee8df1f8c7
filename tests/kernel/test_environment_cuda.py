"""The environment facts read CUDA in a child process, so a notebook kernel never initialises it."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ddp_helpers.kernel.lab import doctor as environment


def test_the_child_process_script_reports_gpus_cudnn_and_nccl():
    proc = subprocess.run(
        [sys.executable, "-c", environment._CUDA_FACTS], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(facts) == {"gpus", "cudnn", "nccl"}
    assert len(facts["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_collect_facts_leaves_cuda_uninitialised_here():
    facts = environment.collect_facts()
    assert len(facts["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert not torch.cuda.is_initialized()
