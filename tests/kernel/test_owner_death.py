"""Whatever kills the owner of a run (a kernel's SIGKILL, a closed terminal, a scheduler's cancel), no
process of the run outlives it: the agent watches a pipe whose write end only the owner holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from conftest import REPO, SCRIPTS, assert_gone, assert_no_processes_left, descendants, processes_matching

STARTED_S = 60.0  # a loaded 2-core machine may take long to import torch in the agent
LEFT_WITHIN_S = 10.0  # the bound: nothing of the run is alive this long after the owner died


def _start_owner(command: list[str], marker: str, tmp_path, processes: int = 2) -> subprocess.Popen[bytes]:
    runs = tmp_path / marker  # every file of the run has the marker in its path: so do its processes
    owner = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "DDP_HELPERS_RUNS_DIR": str(runs)},
        stdout=open(tmp_path / "owner.out", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the test signals the owner alone, as a kernel manager or a scheduler would
    )
    deadline = time.monotonic() + STARTED_S
    while time.monotonic() < deadline:
        # every rank has printed a tick
        ticking = [log for log in runs.rglob("stdout.log") if "tick" in log.read_text()]
        if len(ticking) >= processes and owner.poll() is None:
            time.sleep(1.0)  # the workers are printing their ticks
            return owner
        assert owner.poll() is None, (tmp_path / "owner.out").read_text()
        time.sleep(0.2)
    owner.kill()
    raise AssertionError(f"the run did not start within {STARTED_S}s")


def _kill_and_check(owner: subprocess.Popen[bytes], sig: int, marker: str) -> None:
    # all of them: torchrun's agent, forked by the agent server, and the server itself, whose command
    # lines do not carry the marker
    started = descendants(owner.pid)
    try:
        owner.send_signal(sig)
        owner.wait(timeout=LEFT_WITHIN_S)
        assert_no_processes_left(marker, wait_s=LEFT_WITHIN_S)
        assert_gone(started, wait_s=LEFT_WITHIN_S)
    finally:
        for proc in [
            *processes_matching(marker),
            *started,
        ]:  # never leave the machine busy, even when the test fails
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.parametrize("launcher, processes", [("torchrun", 2), ("python", 1)])
def test_a_killed_kernel_leaves_no_process_of_its_launch(tmp_path, launcher, processes):
    # a Python process that calls launch() and is SIGKILLed: what an out-of-memory kill does to a kernel
    marker = f"owner-{uuid.uuid4().hex}"
    nproc = 2 if launcher == "torchrun" else 1
    code = (
        "import ddp_helpers\n"
        f"ddp_helpers.launch({str(SCRIPTS / 'tick.py')!r}, {marker!r}, nproc={nproc}, launcher={launcher!r}, "
        "timeout=None, progress='off')"
    )
    owner = _start_owner([sys.executable, "-c", code], marker, tmp_path, processes)
    _kill_and_check(owner, signal.SIGKILL, marker)
