"""Start JupyterLab the way `make lab` and the container do, for the tests that talk to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def start(
    script: Path, tmp_path: Path, port: int, log: Path | None = None, **env_vars: str
) -> subprocess.Popen[str]:
    """Run `script` (a lab start script) in its own session. Its output goes to a pipe, or to `log`:
    a long session must not fill a pipe nobody reads, or the server blocks on its own logging."""
    env = dict(
        os.environ,
        LAB_PORT=str(port),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    env.pop("JUPYTER_TOKEN", None)
    env.update(env_vars)

    def popen(stdout):
        return subprocess.Popen(
            ["bash", str(script)],
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    if log is None:
        return popen(subprocess.PIPE)
    with open(log, "w") as out:  # the child has its own copy
        return popen(out)


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
    pytest.fail(f"JupyterLab did not answer:\n{lab.communicate(timeout=10)[0] or ''}")


def stop(lab: subprocess.Popen[str]) -> int:
    if lab.poll() is None:
        os.killpg(lab.pid, signal.SIGTERM)
    return lab.wait(timeout=30)
