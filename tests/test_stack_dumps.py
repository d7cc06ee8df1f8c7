"""Where a hung rank waits: a registered worker dumps its stack on request; nothing else is signalled."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ddp_helpers import LaunchTimeout, launch, stack_dumps
from ddp_helpers.launcher.worker_forks import SWITCH_ENV

# Waits in wait_for_line() until a line comes, then in wait_forever(); a helper thread waits elsewhere.
WAITER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from ddp_helpers import stack_dumps
    stack_dumps.register(Path(sys.argv[1]))
    def helper_thread_waits():
        time.sleep(600)
    threading.Thread(target=helper_thread_waits, daemon=True).start()
    def wait_for_line():
        return sys.stdin.readline()
    def wait_forever():
        while True:
            time.sleep(0.05)
    print("ready", flush=True)
    wait_for_line()
    print("moved on", flush=True)
    wait_forever()
    """
)


@pytest.fixture
def waiter(tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "logs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_registered_process_says_where_it_waits_each_time_it_is_asked(waiter, tmp_path):
    logs = tmp_path / "logs"
    first = stack_dumps.ask({3: waiter.pid}, logs)[3]
    assert first.splitlines()[:2] == [
        f'File "{tmp_path / "waiter.py"}", line 10 in wait_for_line',
        "  return sys.stdin.readline()",
    ]
    assert "helper_thread_waits" not in first  # the main thread's stack, not the helper's
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    assert waiter.stdout.readline() == "moved on\n"
    second = stack_dumps.ask({3: waiter.pid}, logs)[3]  # the newest dump, not the first one again
    assert second.splitlines()[0].endswith("in wait_forever") and "wait_for_line" not in second
    assert waiter.poll() is None  # asking does not stop it


def test_a_process_that_did_not_register_is_not_signalled(tmp_path):
    # the signal's default action ends a process: only a worker with a dump file is asked
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stack_dumps.ask({0: plain.pid}, tmp_path / "logs") == {}
        assert plain.poll() is None
    finally:
        plain.kill()
        plain.wait()


HANG_AFTER_SETUP = textwrap.dedent(
    """
    import time
    import torch.distributed as dist
    from ddp_helpers.distributed import setup_distributed
    info = setup_distributed()
    print(f"rank {info.rank} started", flush=True)
    if info.rank == 1:
        dist.barrier()  # rank 0 never comes
    else:
        time.sleep(600)
    """
)


def test_fresh_workers_that_set_up_through_ddp_helpers_say_where_they_wait(tmp_path, monkeypatch):
    # what a GPU machine runs: torchrun's own interpreters (forked workers are tested in test_launch)
    monkeypatch.setenv(SWITCH_ENV, "off")
    script = tmp_path / "hang_after_setup.py"
    script.write_text(HANG_AFTER_SETUP)
    with pytest.raises(LaunchTimeout) as info:
        launch(
            script,
            nproc=2,
            run_dir=tmp_path / "run",
            timeout=4,
            startup_timeout=120,
            grace_s=2,
            progress="off",
        )
    stacks = info.value.stacks
    assert "dist.barrier()  # rank 0 never comes" in stacks[1]
    assert "time.sleep(600)" in stacks[0]
    assert "waits in (innermost call first):" in str(info.value)
