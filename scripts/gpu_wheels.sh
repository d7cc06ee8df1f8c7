#!/usr/bin/env bash
# Fetch the wheels that `make gpu-check` needs on a GPU machine with torch but no internet: papermill and
# ipykernel, with every dependency the machine's image may lack, for CPython 3.12 on x86-64 Linux.
#
#   bash scripts/gpu_wheels.sh [DEST]        (DEST defaults to .whl; run it where pip reaches PyPI)
#
# Versions are the ones this repository's venv tested (make venv first). Carry DEST to the GPU machine;
# `make gpu-check` installs it with pip --no-index into /tmp/gpu-check-site when there is no venv.
# Keep DEST out of git (e.g. `echo /.whl/ >> .git/info/exclude`).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { echo "no $PY: run make venv first (its versions are the ones pinned here)"; exit 1; }

# The dependency closure of papermill and ipykernel, as installed here, for Python 3.12 on Linux, less
# what a PyTorch GPU image already has (its own builds of these must stay in charge).
mapfile -t PINS < <("$PY" - <<'EOF'
import re
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOTS = ["papermill", "ipykernel"]
IN_THE_IMAGE = {  # the GPU image's torch stack and common libraries: never shadow them
    "torch", "torchvision", "triton", "numpy", "pandas", "matplotlib", "pillow", "psutil", "pyyaml",
    "requests", "urllib3", "idna", "certifi", "charset-normalizer", "tqdm", "click", "pygments", "attrs",
    "aiohttp", "aiosignal", "aiohappyeyeballs", "frozenlist", "multidict", "yarl", "propcache",
    "python-dateutil", "six", "typing-extensions", "packaging", "setuptools", "filelock", "fsspec",
    "jinja2", "markupsafe", "sympy", "mpmath", "networkx",
}
env = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.0",
                               "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
seen, todo = {}, list(ROOTS)
while todo:
    name = norm(todo.pop())
    if name in seen or name in IN_THE_IMAGE:
        continue
    dist = metadata.distribution(name)
    seen[name] = dist.version
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(req.name)
for name, version in sorted(seen.items()):
    print(f"{name}=={version}")
EOF
)
echo "fetching ${#PINS[@]} wheels into $DEST: ${PINS[*]}"
mkdir -p "$DEST"
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
    manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
for pin in "${PINS[@]}"; do
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$DEST" "$pin"
done
ls "$DEST"
du -sh "$DEST"
