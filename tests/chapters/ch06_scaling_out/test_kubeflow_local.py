"""The lesson's training submitted with the Kubeflow SDK, on its local process backend (issue 61): a real
TrainJob run by the SDK's own code, its venv linked to this project's environment instead of a downloaded torch.
The job trained when its log shows every rank's samples and its checkpoint loads into the lesson's model."""

from __future__ import annotations

import importlib.metadata
import shutil
import zipfile

import pytest
import torch

from ddp_helpers.workers import worker_path

kubeflow = pytest.importorskip(
    "kubeflow.trainer",
    reason="the Kubeflow SDK is not installed (pip install kubeflow; the test extra brings it): "
    "its local backend cannot be tried here",
)

from ddp_helpers.chapters.ch06_scaling_out.ch06_kubeflow_local import environment_link_wheel, run_locally  # noqa: E402


def test_the_link_wheel_answers_for_torch_with_torchs_own_entry_points(tmp_path):
    wheel = environment_link_wheel(tmp_path)
    version = importlib.metadata.version("torch").split("+")[0]
    assert wheel.name == f"torch-{version}+workbench-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(f"torch-{version}+workbench.dist-info/entry_points.txt").decode()
        link = archive.read("workbench_environment.pth").decode()
    assert f"torch-{version}+workbench.dist-info/RECORD" in names
    assert "torchrun = torch.distributed.run:main" in entry_points
    own = importlib.metadata.distribution("torch").read_text("entry_points.txt") or ""
    if "torch.distributed.backends" in own:
        assert "gloo = " in entry_points  # torch 2.14 finds gloo by its entry point: a link without it, none
    assert link.startswith("import site; site.addsitedir(") and "site-packages" in link


@pytest.mark.heavy  # the SDK starts the job from a thread of its own
def test_the_lessons_ddp_script_trains_as_a_local_trainjob(tmp_path):
    script = tmp_path / "ddp.py"
    shutil.copy(worker_path("ddp"), script)
    saved = tmp_path / "model.pt"
    job = run_locally(script, ["--epochs", "1", "--save", saved], nproc=2, folder=tmp_path, timeout_s=300)
    text = "\n".join(job.logs)
    assert job.status == "Complete", text[-3000:]
    # ddp.py's rank 0 prints the epoch's mean over every rank's samples: 2 ranks' shards, padding included
    (line,) = [line for line in job.logs if line.startswith("epoch 0: loss")]
    assert "mean over 2048 samples" in line, line
    assert f"saved {saved}" in text
    state = torch.load(saved, map_location="cpu", weights_only=True)
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # the plain model's keys


@pytest.mark.heavy  # the SDK starts the job from a thread of its own
def test_a_failing_job_comes_back_failed_with_its_traceback(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import os\nraise SystemExit(f'rank {os.environ[\"RANK\"]} gives up')\n")
    job = run_locally(script, [], nproc=2, folder=tmp_path, timeout_s=300)
    assert job.status == "Failed"
    assert any("gives up" in line for line in job.logs), "\n".join(job.logs)[-2000:]
