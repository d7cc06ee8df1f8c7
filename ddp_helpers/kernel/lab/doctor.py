"""Facts about this machine, and the PASS / WARN / FAIL / INFO checks on them.

`python -m ddp_helpers doctor` and notebook 00 both show `run_checks()` as a table; the live all_reduce
check, which launches a job, is `allreduce_check.live_allreduce`.
"""

from __future__ import annotations

import json
import os
import platform
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


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


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
    """GPUs (index, name, capability, memory), cuDNN and NCCL versions, read in a child process.

    Empty where no GPU is visible. This process never initialises CUDA.
    """
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
    """Everything the checks look at, as plain values (also saved by gpu-check).

    Safe in a notebook kernel: CUDA is queried in a child process (see `cuda_facts`).
    """
    cuda = torch.cuda.is_available()
    try:
        torchvision_version = metadata.version("torchvision")  # no import: it is slow and may be broken
    except metadata.PackageNotFoundError:
        torchvision_version = None
    gpu = cuda_facts()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision_version,
        "cuda_build": torch.version.cuda,
        "cuda_available": cuda,
        "cudnn": gpu["cudnn"],
        "nccl": gpu["nccl"],
        "gpus": gpu["gpus"],
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


def check_shm(size: int | None) -> Check:
    if size is None:
        return Check(
            "/dev/shm", INFO, "not present", "only Linux has it; DataLoader workers use other means here"
        )
    value = f"{size / 2**30:.2f} GiB"
    if size < SHM_WARN_BYTES:
        return Check(
            "/dev/shm",
            WARN,
            value,
            "DataLoader workers and NCCL pass tensors through shared memory; Docker's default of 64 MiB makes "
            "them crash with 'bus error' or 'No space left on device'. Start the container with --ipc=host "
            "or --shm-size=8g.",
        )
    return Check("/dev/shm", PASS, value)


def check_torch(version: str, torchvision: str | None) -> list[Check]:
    checks = []
    if _version_tuple(version)[:2] >= MIN_TORCH:
        checks.append(Check("torch", PASS, version))
    else:
        checks.append(
            Check("torch", FAIL, version, f"this workbench needs torch >= {'.'.join(map(str, MIN_TORCH))}")
        )
    if torchvision is None:
        checks.append(
            Check("torchvision", FAIL, "not installed", "pip install the torchvision that matches torch")
        )
    else:
        # torchvision 0.(minor+15) goes with torch 2.minor (2.7 <-> 0.22)
        expected = _version_tuple(version)[1] + 15
        ok = _version_tuple(torchvision)[:2] == (0, expected)
        checks.append(
            Check(
                "torchvision",
                PASS if ok else WARN,
                torchvision,
                "" if ok else f"torch {version} expects torchvision 0.{expected}.x",
            )
        )
    return checks


def check_gpus(facts: dict[str, Any]) -> list[Check]:
    if not facts["cuda_available"]:
        build = facts["cuda_build"] or "a CPU-only build"
        return [
            Check(
                "CUDA",
                INFO,
                f"no GPU visible (torch is {build})",
                "everything runs on the CPU with gloo; GPU-only sections say so and skip",
            )
        ]
    checks = [
        Check("CUDA", PASS, f"{facts['cuda_build']}, {len(facts['gpus'])} GPU(s)"),
        Check("cuDNN", PASS if facts["cudnn"] else WARN, str(facts["cudnn"])),
        Check(
            "NCCL",
            PASS if facts["nccl"] else FAIL,
            str(facts["nccl"]),
            "" if facts["nccl"] else "DDP on GPUs needs a torch build with NCCL",
        ),
    ]
    for gpu in facts["gpus"]:
        checks.append(
            Check(
                f"GPU {gpu['index']}",
                PASS,
                f"{gpu['name']}, sm {gpu['capability']}, {gpu['memory_bytes'] / 2**30:.1f} GiB",
            )
        )
    return checks


def run_checks(facts: dict[str, Any] | None = None) -> list[Check]:
    """All static checks (no processes started)."""
    facts = facts or collect_facts()
    py_ok = sys.version_info >= (3, 10)
    checks = [Check("Python", PASS if py_ok else WARN, facts["python"], "" if py_ok else "tested on 3.11")]
    checks += check_torch(facts["torch"], facts["torchvision"])
    checks += check_gpus(facts)
    backends = facts["backends"]
    names = ", ".join(name for name, ok in backends.items() if ok) or "none"
    if facts["cuda_available"]:
        status = PASS if backends["nccl"] else FAIL
    else:
        status = PASS if backends["gloo"] else FAIL
    checks.append(Check("distributed backends", status, names, "" if status == PASS else "no usable backend"))
    checks.append(
        Check("CUDA_VISIBLE_DEVICES", INFO, str(facts["CUDA_VISIBLE_DEVICES"] or "unset (all GPUs)"))
    )
    checks.append(
        Check(
            "OMP_NUM_THREADS",
            INFO,
            str(facts["OMP_NUM_THREADS"] or "unset"),
            f"launch() gives each of N CPU workers {facts['cpu_count']}//N threads unless you set it",
        )
    )
    checks.append(check_shm(facts["shm_bytes"]))
    if facts["nvidia_smi"]:
        checks.append(Check("nvidia-smi", PASS, facts["nvidia_smi"]))
    else:
        status = WARN if facts["cuda_available"] else INFO
        checks.append(Check("nvidia-smi", status, "not found", "only needed to watch GPUs from a terminal"))
    return checks


def checks_frame(checks: list[Check]):
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in checks])


def format_checks(checks: list[Check]) -> str:
    """A plain-text table for the terminal."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<{width}}  {c.value}")
        if c.advice and c.status in (WARN, FAIL):
            lines.append(f"{'':<5} {'':<{width}}  -> {c.advice}")
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0
