"""The generated cluster files: parsed, checked line by line, and their torchrun commands run here.

Here each test plays the scheduler's part in the smallest way: for SLURM, `srun` runs its command
once (one node; tests/test_slurm.py submits the file to a real SLURM); for the PyTorchJob, the
``PET_*`` variables the training operator sets for a one-pod elastic job, and the manifest is
validated against the operator's published CRD schema (tests/data). torchrun and the worker are real.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddp_helpers.lab.cluster_templates import (
    DEFAULT_IMAGE,
    IMAGE_REPO_DIR,
    IMAGE_WORKSPACE,
    pytorchjob_manifest,
    slurm_script,
    write_cluster_templates,
)
from ddp_helpers.launcher.machine import free_port

REPO = Path(__file__).resolve().parent.parent
TRAIN = "ddp_helpers/workers/train.py"

# every rank adds rank + 1 and writes what it got, so the test sees that the world formed
WORKER = """\
import json, os, sys
import torch
import torch.distributed as dist
from ddp_helpers import teardown

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ["DDP_RUN_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": total.item(), "threads": os.environ.get("OMP_NUM_THREADS")}, f)
teardown.destroy_process_group()
"""


def _reports(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# ------------------------------------------------------------------------------------------ SLURM
def test_slurm_script_asks_for_the_cores_of_every_rank_and_passes_them_to_srun(tmp_path):
    text = slurm_script(TRAIN, ["--epochs", 1], nnodes=2, nproc_per_node=8, cpus_per_rank=6, partition="gpu")
    (tmp_path / "job.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0  # valid shell
    directives = [line.split("#")[1].strip() for line in text.splitlines() if line.startswith("#SBATCH")]
    for needed in (
        "SBATCH --nodes=2",
        "SBATCH --ntasks-per-node=1",
        "SBATCH --cpus-per-task=48",
        "SBATCH --gpus-per-node=8",
        "SBATCH --partition=gpu",
    ):
        assert needed in directives, (needed, directives)
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-6}"' in text
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert srun.startswith(
        'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 3 --tee 3'
    )
    assert "MASTER_ADDR=" not in text  # with c10d torchrun sets it for its workers: an export does nothing
    assert '--rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head_node:$rdzv_port"' in srun
    assert srun.endswith(f"{TRAIN} --epochs 1")
    assert (REPO / TRAIN).is_file()  # the path the notebook passes is the repository's worker


def test_slurm_script_on_cpus_requests_no_gpu():
    text = slurm_script("w.py", nnodes=1, nproc_per_node=3, gpus_per_node=0, cpus_per_rank=2)
    assert "--gpus-per-node" not in text.replace("# (no GPUs requested", "")
    assert "#SBATCH --cpus-per-task=6 " in text


@pytest.mark.parametrize("bad", [{"nnodes": 0}, {"nproc_per_node": 0}, {"cpus_per_rank": 0}])
def test_slurm_script_refuses_impossible_shapes(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        slurm_script("w.py", **bad)


def test_generated_sbatch_script_runs_its_torchrun_on_one_cpu_node(tmp_path):
    """The script itself, run by bash with a stand-in for srun: torchrun forms the world."""
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    job = tmp_path / "sbatch.sh"
    job.write_text(
        slurm_script(
            "worker.py",
            ["--out", out],
            nnodes=1,
            nproc_per_node=2,
            gpus_per_node=0,
            cpus_per_rank=1,
            rdzv_port=free_port(),
        )
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(
        bin_dir / "srun", '#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\nexec "$@"\n'
    )  # one task
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_CPUS_PER_TASK="2",
    )
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(out)
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3 and r["threads"] == "1" for r in reports)


def test_slurm_script_elastic_with_restarts_and_a_shared_checkpoint_folder(tmp_path):
    text = slurm_script(
        TRAIN, ["--epochs", 1], nnodes=4, min_nodes=2, max_restarts=5, checkpoint_dir="/shared/ckpt"
    )
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert "--nnodes 2:4" in srun and "--max-restarts 5" in srun
    assert srun.endswith(f"{TRAIN} --epochs 1 --checkpoint-dir /shared/ckpt --resume")
    assert "on a filesystem every node sees" in text and "mkdir -p /shared/ckpt" in text
    with pytest.raises(ValueError, match="min_nodes must be between 1 and nnodes"):
        slurm_script(TRAIN, nnodes=2, min_nodes=3)


# ---------------------------------------------------------------------------------- Kubernetes
def _dockerfile_copies() -> dict[str, str]:
    """Image path -> repository path, for docker/Dockerfile's COPY lines (relative to its WORKDIR)."""
    workdir, copies = "/", {}
    for line in (REPO / "docker" / "Dockerfile").read_text().splitlines():
        words = shlex.split(line) if line.startswith(("WORKDIR ", "COPY ")) else []
        if words[:1] == ["WORKDIR"]:
            workdir = words[1]
        elif words[:1] == ["COPY"]:
            *sources, target = [w for w in words[1:] if not w.startswith("--")]
            if len(sources) == 1:
                copies[os.path.normpath(os.path.join(workdir, target))] = sources[0]
    return copies


def _image_has(path_in_image: str) -> bool:
    for target, source in _dockerfile_copies().items():
        if path_in_image == target or path_in_image.startswith(target + "/"):
            return (REPO / source / os.path.relpath(path_in_image, target)).exists()
    return False


def test_pytorchjob_runs_this_projects_image_where_the_worker_exists():
    job = yaml.safe_load(pytorchjob_manifest(TRAIN, ["--epochs", 1], nnodes=3, nproc_per_node=4))
    assert (job["apiVersion"], job["kind"], job["spec"]["nprocPerNode"]) == (
        "kubeflow.org/v1",
        "PyTorchJob",
        "4",
    )
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Worker": 3}  # elastic: Worker pods only
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 3,
        "maxReplicas": 3,
        "maxRestarts": 3,
    }
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    assert DEFAULT_IMAGE == compose["services"]["lab"]["image"]  # the image docker/Dockerfile builds
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["image"] == DEFAULT_IMAGE and container["name"] == "pytorch"
        command = container["command"]
        assert command[0] == "torchrun" and command[2:] == ["--epochs", "1"]
        script = os.path.join(container["workingDir"], command[1])
        assert _image_has(script), f"{script} is not in the image docker/Dockerfile builds"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["DDP_RUN_DIR"].startswith(IMAGE_WORKSPACE + "/")  # writable by the image's user
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["workingDir"] == IMAGE_REPO_DIR
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^WORKDIR (\S+)", dockerfile, re.M)[-1] == IMAGE_WORKSPACE


def test_pytorchjob_without_gpus_and_on_one_node():
    job = yaml.safe_load(
        pytorchjob_manifest("w.py", nnodes=1, nproc_per_node=2, gpus_per_node=0, image="x:1")
    )
    (spec,) = job["spec"]["pytorchReplicaSpecs"].values()
    (container,) = spec["template"]["spec"]["containers"]
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"] and container["image"] == "x:1"
    assert "nvidia.com/gpu" not in json.dumps(container)


def test_pytorchjob_command_runs_with_the_variables_the_operator_sets(tmp_path):
    """One pod's container, run here: torchrun reads PET_* as the v1 operator sets them for an elastic job.

    (kubeflow/training-operator v1.9.0, pkg/controller.v1/pytorch/elastic.go: PET_RDZV_BACKEND,
    PET_RDZV_ENDPOINT = <job>-worker-0:<port>, PET_NNODES = min:max, PET_MAX_RESTARTS; envvar.go:
    PET_NPROC_PER_NODE.)
    """
    job = yaml.safe_load(
        pytorchjob_manifest("worker.py", nnodes=1, nproc_per_node=2, gpus_per_node=0, cpus_per_rank=1)
    )
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    policy = job["spec"]["elasticPolicy"]
    image_root = tmp_path / "image"  # stands in for the working folder inside the image
    image_root.mkdir()
    (image_root / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({e["name"]: e["value"] for e in container["env"]})
    env.update(
        DDP_RUN_DIR=str(tmp_path / "runs"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        PET_NNODES=f"{policy['minReplicas']}:{policy['maxReplicas']}",
        PET_NPROC_PER_NODE=job["spec"]["nprocPerNode"],
        PET_RDZV_BACKEND=policy["rdzvBackend"],
        PET_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}",
        PET_MAX_RESTARTS=str(policy["maxRestarts"]),
    )
    proc = subprocess.run(
        container["command"], cwd=image_root, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(tmp_path / "runs")
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3 and r["threads"] == "1" for r in reports)


def test_write_cluster_templates_refuses_an_unknown_option(tmp_path):
    paths = write_cluster_templates(tmp_path, TRAIN, nnodes=2, nproc_per_node=2, image="x", cpus_per_rank=2)
    assert "#SBATCH --cpus-per-task=4 " in paths["slurm"].read_text()
    assert yaml.safe_load(paths["kubernetes"].read_text())["spec"]["nprocPerNode"] == "2"
    with pytest.raises(TypeError, match="unknown options: gpus"):
        write_cluster_templates(tmp_path, TRAIN, gpus=2)


# the PyTorchJob CRD's openAPIV3Schema, from kubeflow/training-operator v1.9.0 (tests/data/README.md)
CRD_SCHEMA = json.loads((REPO / "tests" / "data" / "kubeflow_pytorchjob_v1_schema.json").read_text())


def _unknown_fields(value: object, schema: dict, where: str = "") -> list[str]:
    """Fields the schema does not name: Kubernetes drops them silently (pruning), so a typo would vanish."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key in schema["properties"]:
                found += _unknown_fields(item, schema["properties"][key], f"{where}.{key}")
            else:
                found.append(f"{where}.{key}")
        return found
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [
            f
            for key, item in value.items()
            for f in _unknown_fields(item, schema["additionalProperties"], f"{where}.{key}")
        ]
    if isinstance(value, list) and "items" in schema:
        return [
            f for i, item in enumerate(value) for f in _unknown_fields(item, schema["items"], f"{where}[{i}]")
        ]
    return []


@pytest.mark.parametrize(
    "shape",
    [
        {"nnodes": 3, "nproc_per_node": 4},
        {"nnodes": 4, "min_nodes": 2, "gpus_per_node": 0, "checkpoint_dir": "/shared/ckpt"},
    ],
)
def test_pytorchjob_is_valid_against_the_operators_crd_schema(shape):
    jsonschema = pytest.importorskip("jsonschema")
    job = yaml.safe_load(pytorchjob_manifest(TRAIN, ["--epochs", 1], **shape))
    jsonschema.validate(job, CRD_SCHEMA)  # types and required fields
    assert _unknown_fields(job, CRD_SCHEMA) == []


def test_the_crd_check_catches_a_misspelt_field_and_a_wrong_type():
    jsonschema = pytest.importorskip("jsonschema")
    job = yaml.safe_load(pytorchjob_manifest(TRAIN, nnodes=2))
    job["spec"]["elasticPolicies"] = job["spec"].pop("elasticPolicy")
    assert _unknown_fields(job, CRD_SCHEMA) == [".spec.elasticPolicies"]
    job["spec"]["elasticPolicy"] = {**job["spec"].pop("elasticPolicies"), "maxReplicas": "two"}
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        jsonschema.validate(job, CRD_SCHEMA)
