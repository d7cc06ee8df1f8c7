"""JupyterLab as `make lab` and the container start it: notebooks served, token auth always on."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

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


def start(script: Path, tmp_path: Path, port: int, **env_vars: str) -> subprocess.Popen[str]:
    env = dict(os.environ, LAB_PORT=str(port), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    env.pop("JUPYTER_TOKEN", None)
    env.update(env_vars)
    return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def wait_for_contents(lab: subprocess.Popen[str], port: int, token: str) -> str:
    url = f"http://127.0.0.1:{port}/api/contents?token={token}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and lab.poll() is None:
        try:
            status, body = get(url)
            if status == 200:
                return body
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    lab.kill()
    pytest.fail(f"JupyterLab did not answer:\n{lab.communicate(timeout=10)[0]}")


def stop(lab: subprocess.Popen[str]) -> int:
    if lab.poll() is None:
        os.killpg(lab.pid, signal.SIGTERM)
    return lab.wait(timeout=30)


def test_lab_script_serves_the_notebooks_with_a_token(tmp_path):
    port, token = free_port(), "test-token-123"
    lab = start(REPO / "scripts" / "lab.sh", tmp_path, port, JUPYTER_TOKEN=token)
    try:
        body = wait_for_contents(lab, port, token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert "00_environment_check.ipynb" in names
        assert get(f"http://127.0.0.1:{port}/api/contents")[0] == 403  # no token, no access
    finally:
        stop(lab)


def test_container_entrypoint_generates_a_token_and_shuts_down_cleanly(tmp_path):
    # Outside Docker: the same script, pointed at this checkout's notebooks and at localhost.
    port = free_port()
    lab = start(
        REPO / "docker" / "entrypoint.sh",
        tmp_path,
        port,
        NOTEBOOK_DIR=str(REPO / "notebooks"),
        LAB_IP="127.0.0.1",
    )
    try:
        first = lab.stdout.readline() + lab.stdout.readline()
        match = re.search(r"token=([0-9a-f]{48})", first)
        assert match, f"no generated token printed: {first!r}"
        token = match[1]
        body = wait_for_contents(lab, port, token)
        assert any(item["name"].endswith(".ipynb") for item in json.loads(body)["content"])
        assert get(f"http://127.0.0.1:{port}/api/contents")[0] == 403
        assert get(f"http://127.0.0.1:{port}/api/contents?token=wrong")[0] == 403
        assert get(f"http://127.0.0.1:{port}/api")[0] == 200  # what the HEALTHCHECK hits, tokenless
    finally:
        code = stop(lab)
    assert code == 0, lab.stdout.read()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are fine
        sock.bind(("127.0.0.1", port))  # no listener is left: nothing kept serving
