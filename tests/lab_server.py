"""Start JupyterLab the way `make lab` and the container do, for the tests that talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
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


LAB_SETTINGS = {  # one notebook, windowing off (every cell in the DOM), no news or update checks
    "notebook-extension/tracker": {"windowingMode": "none", "autoStartDefaultKernel": True},
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


@contextlib.contextmanager
def serving_cells(root: Path, name: str, cells: list[str], token: str) -> Iterator[tuple[str, Path]]:
    """JupyterLab (scripts/lab.sh) serving one notebook `name` of `cells` under `root/notebooks`.

    Yields the lab's base URL and the served folder; the lab is stopped after."""
    import nbformat

    from ddp_helpers.kernel.launcher.machine import free_port

    served = root / "notebooks"
    served.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, served / name)
    for plugin, values in LAB_SETTINGS.items():
        path = root / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = free_port()
    env = {
        "NOTEBOOK_DIR": str(served),
        "JUPYTER_TOKEN": token,
        "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),
        "DDP_HELPERS_RUNS_DIR": str(served / "runs"),
    }
    lab = start(REPO / "scripts" / "lab.sh", root, port, log=root / "lab.log", **env)
    try:
        wait_for_contents(lab, port, token)
        yield f"http://127.0.0.1:{port}", served
    finally:
        stop(lab)
