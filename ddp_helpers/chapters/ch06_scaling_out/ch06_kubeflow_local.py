"""The lesson's training submitted with the Kubeflow SDK (``pip install kubeflow``) on its local process backend.

The job asks for ``torch`` as a small local wheel that links its fresh venv to this environment: nothing downloads.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import signal
import site
import sys
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

RUNTIME = "torch-distributed"  # the local backend's one runtime (constants.DEFAULT_TRAINING_RUNTIME)
MARK_ENV = "DDP_HELPERS_KUBEFLOW_JOB"  # set in the job's environment: its processes are found by it


def train_lesson(args: dict) -> None:
    """What the job runs under torchrun on each rank: the lesson's ddp.py, as a script."""
    import runpy
    import sys

    sys.argv = [args["script"], *args["argv"]]
    runpy.run_path(args["script"], run_name="__main__")


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def environment_link_wheel(folder: str | os.PathLike[str]) -> Path:
    """A ``torch`` wheel whose ``.pth`` links a venv (of this Python's version) to this environment, with torchrun."""
    version = importlib.metadata.version("torch").split("+")[0] + "+workbench"
    dist_info = f"torch-{version}.dist-info"
    paths = [p for p in site.getsitepackages() if Path(p, "torch").is_dir()]
    if not paths:
        raise RuntimeError("torch is not in this environment's site-packages: nothing to link a job to")
    files = {
        # lines starting with `import` run at start-up: addsitedir also reads that folder's own .pth files
        # (an editable install's, such as ddp_helpers')
        "workbench_environment.pth": f"import site; site.addsitedir({paths[0]!r})\n".encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
            f"Requires-Python: =={sys.version_info.major}.{sys.version_info.minor}.*\n"
            "Summary: this project's torch, linked into a Kubeflow local job's venv (ddp_helpers)\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: ddp_helpers\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        # torch's own: its console scripts (torchrun), and the entry points torch looks itself up by
        # (torch 2.14 finds even gloo through `torch.distributed.backends`), which this dist now answers for
        f"{dist_info}/entry_points.txt": (
            importlib.metadata.distribution("torch").read_text("entry_points.txt")
            or "[console_scripts]\ntorchrun = torch.distributed.run:main\n"
        ).encode(),
    }
    wheel = Path(folder) / f"torch-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


@dataclass
class LocalJob:
    """A job the local backend ran: its name, how it ended, and every line it printed."""

    name: str
    status: str
    logs: list[str]


def run_locally(
    script: str | os.PathLike[str],
    argv: list[str],
    *,
    nproc: int = 2,
    folder: str | os.PathLike[str],
    timeout_s: int = 600,
) -> LocalJob:
    """Submit ``script argv`` as a TrainJob to the SDK's local backend on `nproc` ranks; wait; its status and log."""
    from kubeflow.trainer import CustomTrainer, TrainerClient
    from kubeflow.trainer.backends.localprocess.types import LocalProcessBackendConfig

    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    wheel = environment_link_wheel(folder)
    mark = uuid.uuid4().hex
    client = TrainerClient(backend_config=LocalProcessBackendConfig(cleanup_venv=True))
    trainer = CustomTrainer(
        func=train_lesson,
        func_args={"script": str(Path(script).resolve()), "argv": [str(a) for a in argv]},
        packages_to_install=[f"torch @ {wheel.resolve().as_uri()}"],  # replaces the runtime's torch
        env={
            "PET_NPROC_PER_NODE": str(nproc),  # torchrun's --nproc-per-node
            "PET_STANDALONE": "1",  # a rendezvous on a free port of this machine
            "PIP_NO_INDEX": "1",  # nothing to download: the one package is the wheel above
            "HOME": os.environ.get("HOME", str(Path(folder).resolve())),
            MARK_ENV: mark,  # the SDK stops a job by terminating its shell alone: the ranks are found by this
        },
    )
    name = client.train(runtime=RUNTIME, trainer=trainer)
    try:
        # the local backend waits for the statuses asked for, and only those: Failed is one to stop at
        job = client.wait_for_job_status(
            name, status={"Complete", "Failed"}, timeout=timeout_s, polling_interval=1
        )
    except TimeoutError:
        so_far = "\n".join(client.get_job_logs(name))
        client.delete_job(name)  # terminates the job's shell, not torchrun or the ranks under it
        raise TimeoutError(
            f"the local TrainJob {name} did not end within {timeout_s} s; its log:\n{so_far}"
        ) from None
    finally:
        _kill_marked(mark)
    logs = [line.rstrip("\n") for line in client.get_job_logs(name)]
    return LocalJob(name=name, status=str(job.status), logs=logs)


def _kill_marked(mark: str) -> None:
    """Nothing of the job outlives the call: every process still carrying its mark is killed."""
    from ddp_helpers.kernel.launcher.processes import processes_marked

    for pid in processes_marked(MARK_ENV, mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
