#!/usr/bin/env bash
# Start JupyterLab on notebooks/, the way `make lab` does.
# Token auth stays on: set JUPYTER_TOKEN to choose the token, or Jupyter prints a generated one.
set -euo pipefail
cd "$(dirname "$0")/.."
args=(--notebook-dir=notebooks --ip="${LAB_IP:-127.0.0.1}" --port="${LAB_PORT:-8888}" --no-browser)
# Containers often run as root, and JupyterLab refuses root without this flag.
if [ "$(id -u)" -eq 0 ]; then
    args+=(--allow-root)
fi
exec jupyter lab "${args[@]}" "$@"
