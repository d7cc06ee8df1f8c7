"""Where a hung rank waits: a registered worker dumps its stack on request; nothing else is signalled."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from ddp_helpers import LaunchTimeout, launch
from ddp_helpers.rank import stack_dumps

# Waits in wait_for_line() until a line comes, then in wait_forever(); a helper thread waits elsewhere.
WAITER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from ddp_helpers.rank import stack_dumps
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
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def _ask_until(pid, logs, innermost):
    """Ask until the innermost frame is `innermost`: the waiter prints its marker a moment before it
    waits, and on a busy machine a first answer may come from the print."""
    deadline = time.monotonic() + 20
    while True:
        stack = stack_dumps.ask({3: pid}, logs)[3]
        if stack.splitlines()[0].endswith(f" in {innermost}") or time.monotonic() > deadline:
            return stack


def test_a_registered_process_says_where_it_waits_each_time_it_is_asked(waiter, tmp_path):
    logs = tmp_path / "logs"
    first = _ask_until(waiter.pid, logs, "wait_for_line")
    assert first.splitlines()[:2] == [
        f'File "{tmp_path / "waiter.py"}", line 10 in wait_for_line',
        "  return sys.stdin.readline()",
    ]
    assert "helper_thread_waits" not in first  # the main thread's stack, not the helper's
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    assert waiter.stdout.readline() == "moved on\n"
    second = _ask_until(waiter.pid, logs, "wait_forever")  # the newest dump, not the first one again
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


def test_the_stack_shown_is_the_main_threads_and_reaches_the_scripts_own_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n\nmodel(batch)  # the script's own line\n")
    library = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
    dump = (
        "main thread 0x7f00aa\n"  # faulthandler pads ids with zeros: the same thread
        "Thread 0x00000000007f00bb (most recent call first):\n"
        '  File "/elsewhere/loader.py", line 5 in helper_thread\n\n'
        "Current thread 0x00000000007f00aa (most recent call first):\n"
        + "".join(f'  File "{library}", line {n} in forward\n' for n in range(10, 20))
        + f'  File "{script}", line 3 in <module>\n'
        + '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    lines = stack_dumps.where_it_waits(dump).splitlines()
    assert lines[0] == f'File "{library}", line 10 in forward'
    assert sum(line.startswith("File") for line in lines) == stack_dumps.MAX_FRAMES + 1
    assert lines[-3:] == [
        "...",
        f'File "{script}", line 3 in <module>',
        "  model(batch)  # the script's own line",
    ]
    assert "helper_thread" not in "\n".join(lines)
    assert stack_dumps.where_it_waits(dump.replace("main thread 0x7f00aa", "main thread 0x1")) == ""


HANG_AFTER_SETUP = textwrap.dedent(
    """
    import time
    import torch.distributed as dist
    from ddp_helpers.rank.distributed import setup_distributed
    info = setup_distributed()
    print(f"rank {info.rank} started", flush=True)
    if info.rank == 1:
        dist.barrier()  # rank 0 never comes
    else:
        time.sleep(600)
    """
)


def test_workers_that_set_up_through_ddp_helpers_say_where_they_wait(tmp_path):
    # registered twice (worker_site's sitecustomize, then setup_distributed): once is what counts
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
