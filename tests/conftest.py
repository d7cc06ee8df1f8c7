"""Shared fixtures: tiny worker scripts, and the check that a run left no process behind."""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

SCRIPTS = Path(__file__).parent / "scripts"

# A shell starts background jobs (`pytest ... &`) with SIGINT ignored, and children inherit that:
# the interrupt tests would then test nothing. Ctrl-C must raise KeyboardInterrupt, as in a kernel.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
REPO = Path(__file__).resolve().parent.parent

# make test-fast (DDP_TEST_FAST=1): the tests that start no process. A test, or a fixture it uses, is
# skipped at the moment it would start one (torchrun, a kernel, a python), so what remains runs in
# seconds and stays so as tests are added; make test runs them all.
FAST_ENV = "DDP_TEST_FAST"


@pytest.fixture(scope="session", autouse=True)
def _no_process_in_the_fast_tier():
    """Session-wide, so it comes before any fixture that would start a process (its scope is widest)."""
    if os.environ.get(FAST_ENV) != "1":
        yield
        return

    def refuse(*args, **kwargs):
        pytest.skip("starts a process (make test runs it)")

    patched = pytest.MonkeyPatch()
    patched.setattr(subprocess.Popen, "_execute_child", refuse)
    patched.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    patched.setattr(os, "fork", refuse)
    patched.setattr(os, "posix_spawn", refuse)
    yield
    patched.undo()


def pytest_collection_modifyitems(config, items):
    # The notebooks are the longest single tests: started first, they do not leave one xdist worker running
    # a chapter alone at the end while the other sits idle. (`--dist loadgroup` hands out the xdist_group
    # modules, its larger units of work, before any single test: pytest-xdist's --loadscope-reorder.)
    items.sort(key=lambda item: "notebooks" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _quiet_progress(monkeypatch, tmp_path):
    # Tests read stdout; a progress bar there would only get in the way.
    monkeypatch.setenv("DDP_HELPERS_PROGRESS", "off")
    monkeypatch.setenv("DDP_HELPERS_RUNS_DIR", str(tmp_path / "runs"))


def processes_matching(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes, other than this one, whose command line mentions `marker`, and
    torchrun agents whose open files do.

    An agent forked from the agent server has the server's command line, but its output goes to the
    run's ``logs/torchrun.log``.
    """
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(proc.info["cmdline"] or [])
            if marker in command or (
                "agent_server" in command and any(marker in f.path for f in proc.open_files())
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process under `pid` now (to check later that none outlived it)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def assert_gone(processes: list[psutil.Process], wait_s: float) -> None:
    """None of `processes` (a pid reused by a stranger is not one of them) still runs after `wait_s`."""
    _, alive = psutil.wait_procs(processes, timeout=wait_s)
    alive = [p for p in alive if p.is_running() and not _exiting(p)]
    assert not alive, f"still running: {[(p.pid, ' '.join(p.cmdline())) for p in alive]}"


def _exiting(proc: psutil.Process) -> bool:
    """A zombie, or a process inside its exit: its address space is gone already (no user code can run
    again), the kernel has not made it a zombie yet. On a busy machine that step can take a while."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE or proc.memory_info().vms == 0
    except psutil.NoSuchProcess:
        return True


def assert_no_processes_left(marker: str, wait_s: float = 3.0) -> None:
    deadline = time.monotonic() + wait_s
    while processes_matching(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(p.pid, " ".join(p.cmdline())) for p in processes_matching(marker)]
    assert not left, f"processes of the run are still alive: {left}"


@pytest.fixture(autouse=True)
def _no_process_left_behind(tmp_path):
    """After every test, nothing started with this test's folder on its command line may still run.

    torchrun's own command line holds ``--log-dir <run_dir>/logs``, and test scripts live in tmp_path.
    """
    yield
    assert_no_processes_left(str(tmp_path))


@pytest.fixture
def script(tmp_path):
    """Copy a test script into this test's own folder, so its path marks this test's processes."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        target.write_text((SCRIPTS / name).read_text())
        return target

    return copy
