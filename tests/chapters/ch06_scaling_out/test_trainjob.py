"""The Kubernetes file the workbench writes: a Kubeflow Trainer v2 TrainJob on the torch-distributed runtime.

Checked against the fields and types of Kubeflow Trainer v2.2.0's TrainJob CRD, as far as the file uses
them (tests/data/kubeflow_trainjob_v2_fields.json, pruned from the CRD by scripts/prune_crd_schema.py), and
against what the runtime owns (kubeflow/trainer v2.2.0: manifests/base/runtimes/torch_distributed.yaml,
pkg/constants/constants.go, pkg/runtime/framework/plugins/torch/torch.go). Its torchrun command is run here
with the PET_* variables the torch plugin sets.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_cluster_templates import WORKER, _reports

from ddp_helpers.chapters.ch06_scaling_out.ch06_cluster_templates import write_cluster_templates
from ddp_helpers.chapters.ch06_scaling_out.ch06_trainjob import (
    DEFAULT_IMAGE,
    IMAGE_REPO_DIR,
    RESERVED_ENV,
    SHARED_MOUNT,
    trainjob_manifest,
)
from ddp_helpers.kernel.launcher.machine import free_port

REPO = Path(__file__).resolve().parents[3]
FIELDS = json.loads((REPO / "tests" / "data" / "kubeflow_trainjob_v2_fields.json").read_text())
TRAIN = "ddp_helpers/workers/train.py"
# what the torch-distributed ClusterTrainingRuntime holds (v2.2.0): one replicated job and one container,
# both named "node" (constants.Node), and the PET_* variables the torch plugin sets on that container
RUNTIME_JOB = RUNTIME_CONTAINER = "node"
PLUGIN_SETS = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
SHAPES = [
    {"nnodes": 2, "nproc_per_node": 8, "checkpoint_dir": f"{SHARED_MOUNT}/ckpt/run1"},
    {"nnodes": 1, "nproc_per_node": 2, "gpus_per_node": 0, "max_restarts": 0},
    {"nnodes": 4, "nproc_per_node": 4, "gpus_per_node": 4, "cpus_per_rank": 2, "image": "reg.example/x:1"},
]


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


def _image_uid() -> int:
    """The uid docker/Dockerfile's image runs as: its USER, through its ARG's default."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    user = re.findall(r"^USER (\S+)", dockerfile, re.M)[-1]
    if arg := re.fullmatch(r"\$\{(\w+)\}", user):
        default = re.search(rf"^ARG {arg[1]}=(\d+)", dockerfile, re.M)
        assert default, f"no ARG {arg[1]} with a default in docker/Dockerfile"
        user = default[1]
    return int(user)


def _on_volume(path: str, mounts: dict[str, dict]) -> dict | None:
    """The volume `path` lies on: the one mounted at its longest mounted prefix, or None."""
    found = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
    return mounts[max(found, key=len)] if found else None


def documents(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def pod_patch(job: dict) -> dict:
    (patch,) = job["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == RUNTIME_JOB
    return replicated["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_trainjob_has_the_crds_fields_and_types(shape):
    jsonschema = pytest.importorskip("jsonschema")
    job = documents(trainjob_manifest(TRAIN, ["--epochs", 1], **shape))["TrainJob"]
    jsonschema.validate(job, FIELDS)  # types, bounds and required fields
    assert _unknown_fields(job, FIELDS) == [], "fields the CRD does not have (Kubernetes would drop them)"
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")


def test_the_field_check_catches_a_wrong_type_and_a_field_the_crd_lacks():
    jsonschema = pytest.importorskip("jsonschema")
    job = documents(trainjob_manifest(TRAIN))["TrainJob"]
    job["spec"]["trainer"]["numNodes"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        jsonschema.validate(job, FIELDS)
    job["spec"]["trainer"]["numNodes"] = 2
    job["spec"]["trainer"]["elasticPolicy"] = {"minReplicas": 1}  # v1's field: v2 has none
    assert _unknown_fields(job, FIELDS) == [".spec.trainer.elasticPolicy"]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_job_sets_its_shape_and_leaves_to_the_runtime_what_the_runtime_owns(shape):
    job = documents(trainjob_manifest(TRAIN, **shape))["TrainJob"]
    assert job["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (shape["nnodes"], shape["nproc_per_node"])
    gpus = shape.get("gpus_per_node", shape["nproc_per_node"])
    assert trainer["resourcesPerNode"]["limits"].get("nvidia.com/gpu", 0) == gpus
    assert not PLUGIN_SETS & {e["name"] for e in trainer["env"]}, "the admission webhook refuses these"
    assert set(RESERVED_ENV) == PLUGIN_SETS
    (container,) = pod_patch(job)["containers"]
    assert container["name"] == RUNTIME_CONTAINER and "env" not in container  # node's env: spec.trainer only
    command = trainer["command"]
    assert command[:2] == ["torchrun", "--rdzv-backend=c10d"]
    assert f"--max-restarts={shape.get('max_restarts', 3)}" in command
    assert f"{IMAGE_REPO_DIR}/{TRAIN}" in command  # the image's copy of the repository holds the worker


def test_the_trainjob_runs_this_projects_image_where_the_worker_exists():
    trainer = documents(trainjob_manifest(TRAIN, ["--epochs", 1]))["TrainJob"]["spec"]["trainer"]
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    assert trainer["image"] == DEFAULT_IMAGE == compose["services"]["lab"]["image"]  # docker/Dockerfile's
    script = trainer["command"][trainer["command"].index("--epochs") - 1]
    assert _image_has(script), f"{script} is not in the image docker/Dockerfile builds"


def test_the_trainjob_writes_only_to_mounted_volumes_shared_by_every_pod_and_writable_by_its_user():
    docs = documents(trainjob_manifest(TRAIN, ["--epochs", 1], checkpoint_dir=f"{SHARED_MOUNT}/ckpt/run1"))
    claim, job = docs["PersistentVolumeClaim"], docs["TrainJob"]
    pod = pod_patch(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    env = {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"]}
    command = job["spec"]["trainer"]["command"]
    for what, path in {
        "the run folder": env["DDP_RUN_DIR"],
        "the checkpoints": command[command.index("--checkpoint-dir") + 1],
    }.items():
        volume = _on_volume(path, mounts)
        assert volume == {
            "name": "shared",
            "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
        }, what
    assert _on_volume("/tmp", mounts) and _on_volume("/dev/shm", mounts)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pod["securityContext"]["runAsUser"] == _image_uid()
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"checkpoint_dir": "/checkpoints/run1"}, f"must lie under {SHARED_MOUNT}"),
        ({"checkpoint_dir": f"{SHARED_MOUNT}-other/run1"}, f"must lie under {SHARED_MOUNT}"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"nnodes": 0}, "must be >= 1"),
    ],
)
def test_bad_options_are_refused(options, said):
    with pytest.raises(ValueError, match=said):
        trainjob_manifest(TRAIN, **options)


def test_the_trainjob_command_runs_with_the_variables_the_torch_plugin_sets(tmp_path):
    """One pod's container, run here: torchrun reads the PET_* variables the torch plugin sets, and meets the
    other ranks at the c10d rendezvous on the runtime's master address, which Kubernetes puts into the
    command from the container's environment ($(VAR))."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    job = documents(
        trainjob_manifest(str(worker), nnodes=1, nproc_per_node=2, gpus_per_node=0, cpus_per_rank=1)
    )
    trainer = job["TrainJob"]["spec"]["trainer"]
    plugin = {  # as torch.go sets them for one node of two processes (the address: 127.0.0.1 here)
        "PET_NNODES": str(trainer["numNodes"]),
        "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
    }
    command = [part.replace("$(PET_MASTER_ADDR)", plugin["PET_MASTER_ADDR"]) for part in trainer["command"]]
    command = [part.replace("$(PET_MASTER_PORT)", plugin["PET_MASTER_PORT"]) for part in command]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({e["name"]: e["value"] for e in trainer["env"]}, **plugin)
    env.update(
        DDP_RUN_DIR=str(tmp_path / "runs"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        TMPDIR=str(tmp_path),
    )
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(tmp_path / "runs")
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3 and r["threads"] == "1" for r in reports)


def test_write_cluster_templates_writes_the_trainjob_and_says_it_has_no_min_nodes(tmp_path):
    paths = write_cluster_templates(tmp_path, TRAIN, nnodes=4, nproc_per_node=2, min_nodes=2)
    assert paths["kubernetes"].name == "trainjob.yaml"
    text = paths["kubernetes"].read_text()
    assert "TrainJob" in documents(text) and "min_nodes=2 is not here" in text.splitlines()[0]
    assert "--nnodes 2:4" in paths["slurm"].read_text()  # sbatch.sh has it
    assert sorted(paths) == ["kubernetes", "slurm", "srun"]
    plain = write_cluster_templates(tmp_path / "plain", TRAIN, nnodes=2, nproc_per_node=2)
    assert plain["kubernetes"].read_text().startswith("apiVersion: v1")  # no note without min_nodes
