"""The agent server: each run's torchrun agent is forked from one process that imported torch once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import assert_gone, descendants, processes_matching

from ddp_helpers import launch
from ddp_helpers.kernel.lab.chapter import chapter_setup
from ddp_helpers.kernel.launcher import agent_client, runner
from ddp_helpers.kernel.launcher.agent_client import MAX_REQUEST_BYTES, ForkedAgent
from ddp_helpers.kernel.launcher.agent_server import IDLE_ENV
from ddp_helpers.kernel.launcher.config import make_config
from ddp_helpers.kernel.launcher.processes import ProcessTree, start_run, stop_run, wait_for_exit
from ddp_helpers.kernel.launcher.run_follower import RunFollower


@pytest.fixture(autouse=True)
def _no_server_from_an_earlier_test():
    agent_client.stop_servers()
    assert agent_client.wait_for_stopped_servers(30)
    yield
    agent_client.stop_servers()
    assert agent_client.wait_for_stopped_servers(30)


def _server_pids() -> list[int]:
    return [server.process.pid for server in agent_client.SERVERS.running.values()]


def _run(config) -> ForkedAgent:
    proc = start_run(config)
    assert isinstance(proc, ForkedAgent)
    return proc


def test_each_run_forks_its_agent_from_the_same_warm_server(tmp_path, monkeypatch):
    (tmp_path / "exit3.py").write_text("import sys\nprint('hello from a rank')\nsys.exit(3)\n")
    pids, parents, codes = [], [], []
    for name in ("a", "b"):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"run {name}")  # a variable read at run time only
        config = make_config(tmp_path / "exit3.py", nproc=1, run_dir=tmp_path / name)
        agent = _run(config)
        pids.append(agent.pid)
        parents.append(psutil.Process(agent.pid).ppid())
        assert wait_for_exit(agent, 120)
        codes.append(agent.returncode)
        stop_run(ProcessTree(agent.pid), agent, 2.0)
    [server] = _server_pids()
    assert parents == [server, server] and pids[0] != pids[1]
    # the worker's exit code 3 makes torchrun fail: the agent's own code, 1, comes back through the server
    assert codes == [1, 1]
    [stdout] = (tmp_path / "b" / "logs").rglob("stdout.log")
    assert "hello from a rank" in stdout.read_text()


def test_a_variable_torch_reads_at_import_gets_a_server_of_its_own(script, tmp_path):
    plain = launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "plain")
    # LOGLEVEL sets torchrun's loggers when torch.distributed.elastic is imported: a server that had
    # imported it without LOGLEVEL could not honour it
    verbose = launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "verbose", env={"LOGLEVEL": "INFO"})
    assert len(_server_pids()) == 2
    assert plain.agent == verbose.agent == "forked"
    info = re.compile(r"I\d{4} ")  # torch's INFO lines: "I1201 23:08:00.756000 11519 .../run.py:1102] ..."
    assert not any(info.match(line) for line in plain.launcher_output), plain.launcher_output
    assert any(info.match(line) for line in verbose.launcher_output), verbose.launcher_output
    launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "debug", env={"LOGLEVEL": "DEBUG"})
    assert len(_server_pids()) == agent_client.KEEP_SERVERS  # the least recently used one was told to leave
    assert agent_client.wait_for_stopped_servers(30)


def test_torch_distributed_debug_reaches_the_workers_of_a_run_forked_from_the_same_server(tmp_path):
    level = tmp_path / "level.py"
    level.write_text("import torch.distributed as dist\nprint('debug level', dist.get_debug_level().name)\n")
    seen = []
    for name, env in (("plain", {}), ("detail", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}), ("again", {})):
        result = launch(level, nproc=1, run_dir=tmp_path / name, env=env)
        assert result.agent == "forked"
        seen.append(next(line.split()[-1] for line in result.logs[0] if "debug level" in line))
    assert len(_server_pids()) == 1  # one server forked all three
    assert seen == ["OFF", "DETAIL", "OFF"]  # the workers read it; the server's own environment kept none


def test_a_dead_server_is_replaced_and_its_runs_still_report_how_they_ended(script, tmp_path):
    configs = [
        make_config(script("tick.py"), nproc=1, run_dir=tmp_path / name, timeout=None) for name in ("a", "b")
    ]
    stopped, killed = (_run(config) for config in configs)
    [server] = _server_pids()
    os.kill(server, signal.SIGKILL)
    trees = [ProcessTree(agent.pid) for agent in (stopped, killed)]
    stop_run(trees[0], stopped, 2.0)  # SIGTERM: the agent stops its worker and says how it ended itself
    assert stopped.returncode == 128 + signal.SIGTERM and not stopped.status_lost
    os.kill(killed.pid, signal.SIGKILL)  # no word from the agent, and none from its dead server
    stop_run(trees[1], killed, 2.0)
    assert killed.returncode == 1 and killed.status_lost
    failure = runner._failure(RunFollower(configs[1]), killed, killed.returncode)
    assert "how the run ended is unknown" in str(failure)
    assert not trees[0].alive() and not trees[1].alive()
    result = launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "after")
    assert result.returncode == 0
    [fresh] = _server_pids()
    assert fresh != server


def test_an_interrupt_while_the_server_imports_torch_leaves_nothing(script, tmp_path):
    code = textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from ddp_helpers.kernel.launcher.config import make_config
        from ddp_helpers.kernel.launcher.runner import run_config
        config = make_config({str(script("tick.py"))!r}, nproc=1, run_dir={str(tmp_path / "run")!r}, progress="off")
        print("starting", flush=True)
        try:
            run_config(config)
        except KeyboardInterrupt as interrupted:
            print(type(interrupted).__name__, interrupted, flush=True)
        print("the kernel lives on", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "starting\n"
        time.sleep(0.5)  # the server is importing torch (seconds): the launch waits for it to fork the agent
        started = descendants(child.pid)
        assert any("agent_server" in " ".join(p.cmdline()) for p in started), started
        child.send_signal(signal.SIGINT)
        said = child.stdout.readline()
        assert said.startswith("LaunchInterrupted interrupted while the run started"), said
        assert child.stdout.readline() == "the kernel lives on\n"
        assert_gone(started, wait_s=5)
        assert [p.pid for p in processes_matching(str(tmp_path))] == [child.pid]  # tick.py is on its line
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("why", ["switched off", "an environment too big for one message"])
def test_a_fresh_agent_where_no_server_can_fork_it(script, tmp_path, monkeypatch, why):
    env = {"BIG": "x" * MAX_REQUEST_BYTES} if why.startswith("an env") else {}
    if why == "switched off":
        monkeypatch.setenv(agent_client.SWITCH_ENV, "off")
    config = make_config(script("chatty.py"), nproc=1, run_dir=tmp_path / "run", env=env)
    proc = start_run(config)
    assert not isinstance(proc, ForkedAgent) and proc.kind == "fresh"
    assert psutil.Process(proc.pid).ppid() == os.getpid()
    assert wait_for_exit(proc, 120) and proc.returncode == 0
    stop_run(ProcessTree(proc.pid), proc, 2.0)
    assert _server_pids() == []


def test_an_idle_server_leaves_and_the_next_launch_starts_another(script, tmp_path, monkeypatch):
    monkeypatch.setenv(IDLE_ENV, "1")
    launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "first")
    [server] = agent_client.SERVERS.running.values()
    deadline = time.monotonic() + 30
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.alive() and server.process.returncode == 0
    assert launch(script("chatty.py"), nproc=1, run_dir=tmp_path / "second").returncode == 0
    [fresh] = _server_pids()
    assert fresh != server.process.pid


def test_chapter_setup_starts_the_server_that_the_first_launch_forks_from(script, tmp_path):
    chapter_setup("01", 1)
    [server] = agent_client.SERVERS.running.values()
    agent = _run(make_config(script("chatty.py"), nproc=1, run_dir=tmp_path / "run"))
    assert psutil.Process(agent.pid).ppid() == server.process.pid
    assert wait_for_exit(agent, 120) and agent.returncode == 0
    stop_run(ProcessTree(agent.pid), agent, 2.0)
