#!/usr/bin/env bash
# Start JupyterLab on the notebooks, the way `make lab` (and the container's entrypoint) does.
# Token auth is always on: JUPYTER_TOKEN chooses the token; without it one is generated and printed.
#   NOTEBOOK_DIR  what to serve (default: this repository's notebooks/)
#   LAB_IP        address to bind (default 127.0.0.1; the container binds 0.0.0.0 behind Docker's port map)
#   LAB_PORT      port (default 8888)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
notebook_dir="${NOTEBOOK_DIR:-$repo/notebooks}"
port="${LAB_PORT:-8888}"
if [ -z "${JUPYTER_TOKEN:-}" ]; then
    JUPYTER_TOKEN="$(python -c 'import secrets; print(secrets.token_hex(24))')"
    echo "JUPYTER_TOKEN was not set; this run's token is generated:"
    echo "    http://127.0.0.1:${port}/lab?token=${JUPYTER_TOKEN}"
fi
export JUPYTER_TOKEN
args=(--notebook-dir="$notebook_dir" --ip="${LAB_IP:-127.0.0.1}" --port="$port" --no-browser)
# Containers often run as root, and JupyterLab refuses root without this flag.
if [ "$(id -u)" -eq 0 ]; then
    args+=(--allow-root)
fi
exec jupyter lab "${args[@]}" "$@"
