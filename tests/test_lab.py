"""`make lab`'s start script serves the notebooks, with token auth on, and as root too."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def test_lab_script_serves_the_notebooks_with_a_token(tmp_path):
    port, token = free_port(), "test-token-123"
    env = dict(os.environ, LAB_PORT=str(port), JUPYTER_TOKEN=token, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    lab = subprocess.Popen(["bash", str(REPO / "scripts" / "lab.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/api/contents"
        deadline = time.monotonic() + 90
        status, body = 0, ""
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                status, body = get(f"{url}?token={token}")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        assert status == 200, (
            f"JupyterLab did not answer: {lab.stdout.read() if lab.poll() is not None else ''}"
        )
        names = {item["name"] for item in json.loads(body)["content"]}
        assert "00_environment_check.ipynb" in names
        assert get(url)[0] == 403  # no token, no access
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
