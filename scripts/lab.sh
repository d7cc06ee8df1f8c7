#!/usr/bin/env bash
# Start JupyterLab on the notebooks, the way `make lab` (and the container's entrypoint) does.
# Token auth is always on: JUPYTER_TOKEN chooses the token; without it one is generated and printed.
#   NOTEBOOK_DIR  what to serve (default: this repository's notebooks/)
#   LAB_IP        address to bind (default 127.0.0.1; the container binds 0.0.0.0 behind Docker's port map)
#   LAB_PORT      port (default 8888)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
notebook_dir="${NOTEBOOK_DIR:-$repo/notebooks}"
wanted="${LAB_PORT:-8888}"
# The first free port from LAB_PORT on, chosen here and given to Jupyter with no retries of its own: Jupyter
# would move to the next port by itself, and the URL printed below would name the taken one.
port="$(python - "$wanted" "${LAB_IP:-127.0.0.1}" <<'PY'
import socket, sys
first, ip = int(sys.argv[1]), sys.argv[2]
for port in range(first, first + 50):
    with socket.socket() as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            continue
        print(port)
        break
else:
    sys.exit(f"lab.sh: ports {first} to {first + 49} are all taken on {ip}; set LAB_PORT=...")
PY
)"
if [ "$port" != "$wanted" ]; then
    echo "port $wanted is taken (another server?): JupyterLab starts on port $port"
fi
if [ -z "${JUPYTER_TOKEN:-}" ]; then
    JUPYTER_TOKEN="$(python -c 'import secrets; print(secrets.token_hex(24))')"
    echo "JUPYTER_TOKEN was not set; this run's token is generated:"
    echo "    http://127.0.0.1:${port}/lab?token=${JUPYTER_TOKEN}"
fi
export JUPYTER_TOKEN
args=(--notebook-dir="$notebook_dir" --ip="${LAB_IP:-127.0.0.1}" --port="$port" --ServerApp.port_retries=0 --no-browser)
# Containers often run as root, and JupyterLab refuses root without this flag.
if [ "$(id -u)" -eq 0 ]; then
    args+=(--allow-root)
fi
exec jupyter lab "${args[@]}" "$@"
