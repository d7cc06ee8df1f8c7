"""Facts about this machine, and the PASS / WARN / FAIL / INFO checks on them."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

PASS, WARN, FAIL, INFO = "PASS", "WARN", "FAIL", "INFO"
MIN_TORCH = (2, 7)
SHM_WARN_BYTES = 1 << 30


@dataclass
class Check:
    name: str
    status: str
    value: str
    advice: str = ""


def _major_minor(version: str) -> tuple[int, ...]:
    """(2, 7) for "2.7.1+cu128"; (0, 22) for "0.22.0a0"."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:2])


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory filesystem, or None where there is none (macOS, Windows)."""
    try:
        stat = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stat.f_frsize * stat.f_blocks


# Run in a child process: asking torch for device properties initialises CUDA in the asking
# process, and the notebook kernel must never do that (the ranks own the GPUs).
_CUDA_FACTS = """
import json, torch, torch.distributed as dist
gpus = []
for index in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(index)
    gpus.append({"index": index, "name": p.name, "capability": f"{p.major}.{p.minor}",
                 "memory_bytes": p.total_memory})
nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else None
print(json.dumps({"gpus": gpus, "cudnn": torch.backends.cudnn.version(), "nccl": nccl}))
"""


def cuda_facts(timeout: float = 120) -> dict[str, Any]:
    """GPUs (index, name, capability, memory), cuDNN and NCCL versions, read in a child process."""
    if not torch.cuda.is_available():  # reads the device count only: no CUDA initialisation
        return {"gpus": [], "cudnn": None, "nccl": None}
    proc = subprocess.run(
        [sys.executable, "-c", _CUDA_FACTS], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reading the GPUs' properties failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpu_facts() -> list[dict[str, Any]]:
    """One dict per visible GPU (see `cuda_facts`)."""
    return cuda_facts()["gpus"]


def collect_facts() -> dict[str, Any]:
    """Everything the checks look at, as plain values (also saved by gpu-check); CUDA in a child process."""
    try:
        torchvision_version = metadata.version("torchvision")  # no import: it is slow and may be broken
    except metadata.PackageNotFoundError:
        torchvision_version = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision_version,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        **cuda_facts(),  # cudnn, nccl, gpus
        "backends": {
            "gloo": dist.is_gloo_available(),
            "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available(),
        },
        "cpu_count": os.cpu_count(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "shm_bytes": shm_bytes(),
        "nvidia_smi": shutil.which("nvidia-smi"),
    }


def _either(name: str, ok: Any, value: str, advice: str, bad: str = FAIL) -> Check:
    """PASS, or `bad` with the advice."""
    return Check(name, PASS, value) if ok else Check(name, bad, value, advice)


def check_shm(size: int | None) -> Check:
    if size is None:
        return Check("/dev/shm", INFO, "not present", "only Linux has it; DataLoader workers use other means")
    advice = (
        "DataLoader workers and NCCL pass tensors through shared memory; Docker's default of 64 MiB makes "
        "them crash with 'bus error' or 'No space left on device'. Start the container with --ipc=host "
        "or --shm-size=8g."
    )
    return _either("/dev/shm", size >= SHM_WARN_BYTES, f"{size / 2**30:.2f} GiB", advice, WARN)


def check_torch(version: str, torchvision: str | None) -> list[Check]:
    need = f"this workbench needs torch >= {'.'.join(map(str, MIN_TORCH))}"
    checks = [_either("torch", _major_minor(version) >= MIN_TORCH, version, need)]
    if torchvision is None:
        advice = "pip install the torchvision that matches torch"
        return [*checks, Check("torchvision", FAIL, "not installed", advice)]
    expected = _major_minor(version)[1] + 15  # torchvision 0.(minor+15) goes with torch 2.minor
    matches = _major_minor(torchvision) == (0, expected)
    advice = f"torch {version} expects torchvision 0.{expected}.x"
    return [*checks, _either("torchvision", matches, torchvision, advice, WARN)]


def check_gpus(facts: dict[str, Any]) -> list[Check]:
    if not facts["cuda_available"]:
        value = f"no GPU visible (torch is {facts['cuda_build'] or 'a CPU-only build'})"
        return [Check("CUDA", INFO, value, "everything runs on the CPU with gloo; GPU-only sections skip")]
    return [
        Check("CUDA", PASS, f"{facts['cuda_build']}, {len(facts['gpus'])} GPU(s)"),
        _either("cuDNN", facts["cudnn"], str(facts["cudnn"]), "", WARN),
        _either("NCCL", facts["nccl"], str(facts["nccl"]), "DDP on GPUs needs a torch build with NCCL"),
        *(
            Check(
                f"GPU {g['index']}",
                PASS,
                f"{g['name']}, sm {g['capability']}, {g['memory_bytes'] / 2**30:.1f} GiB",
            )
            for g in facts["gpus"]
        ),
    ]


def run_checks(facts: dict[str, Any] | None = None) -> list[Check]:
    """All static checks (no processes started)."""
    facts = facts or collect_facts()
    backends, cuda, smi = facts["backends"], facts["cuda_available"], facts["nvidia_smi"]
    names = ", ".join(name for name, ok in backends.items() if ok) or "none"
    threads = f"launch() gives each of N CPU workers {facts['cpu_count']}//N threads unless you set it"
    return [
        _either("Python", sys.version_info >= (3, 10), facts["python"], "tested on 3.11", WARN),
        *check_torch(facts["torch"], facts["torchvision"]),
        *check_gpus(facts),
        _either("distributed backends", backends["nccl" if cuda else "gloo"], names, "no usable backend"),
        Check("CUDA_VISIBLE_DEVICES", INFO, str(facts["CUDA_VISIBLE_DEVICES"] or "unset (all GPUs)")),
        Check("OMP_NUM_THREADS", INFO, str(facts["OMP_NUM_THREADS"] or "unset"), threads),
        check_shm(facts["shm_bytes"]),
        _either(
            "nvidia-smi", smi, smi or "not found", "to watch GPUs from a terminal", WARN if cuda else INFO
        ),
    ]


def checks_frame(checks: list[Check]):
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in checks])


def format_checks(checks: list[Check]) -> str:
    """A plain-text table for the terminal."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<{width}}  {c.value}")
        lines += [f"{'':<5} {'':<{width}}  -> {c.advice}"] if c.advice and c.status in (WARN, FAIL) else []
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0
