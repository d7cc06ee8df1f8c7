"""JupyterLab as `make lab` and the container start it: notebooks served, token auth always on."""

from __future__ import annotations

import json
import re
import socket

from lab_server import REPO, get, start, stop, wait_for_contents

from ddp_helpers.kernel.launcher.machine import free_port


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
    assert lab.stdout is not None  # no log given: a pipe
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


def test_a_taken_port_moves_the_lab_and_the_printed_url_with_it(tmp_path):
    # it printed http://127.0.0.1:PORT/... while Jupyter itself moved on to PORT+1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lab = start(REPO / "scripts" / "lab.sh", tmp_path, port)
        assert lab.stdout is not None  # no log given: a pipe
        try:
            said = lab.stdout.readline() + lab.stdout.readline() + lab.stdout.readline()
            match = re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=([0-9a-f]{48})", said)
            assert match and f"port {port} is taken" in said, said
            served = int(match[1])
            assert served != port, said
            wait_for_contents(lab, served, match[2])  # the printed URL is the one that serves
        finally:
            stop(lab)
