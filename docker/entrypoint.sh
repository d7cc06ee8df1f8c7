#!/usr/bin/env bash
# The container's entrypoint: JupyterLab on /workspace/notebooks, reachable through Docker's port map.
# Extra arguments go to `jupyter lab`. Token auth stays on (see scripts/lab.sh).
set -euo pipefail
export NOTEBOOK_DIR="${NOTEBOOK_DIR:-/workspace/notebooks}"
export LAB_IP="${LAB_IP:-0.0.0.0}"  # inside the container; compose publishes it on 127.0.0.1 only
exec bash "$(dirname "$0")/../scripts/lab.sh" "$@"
