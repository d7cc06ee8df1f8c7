"""A process that imports torch once and forks each run's torchrun agent (about 3 s saved per launch).

One request on the inherited Unix socket: JSON ``{"argv", "env", "cwd"}`` and three fds (the run's socket, its
output, its lifeline); the server answers the agent's pid, then its exit code. Safe to fork: one thread."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import traceback
from typing import Any

from ddp_helpers.kernel.launcher.torchrun_agent import ended_children

SERVER_FD_ENV = "DDP_HELPERS_SERVER_FD"
IDLE_ENV = "DDP_HELPERS_AGENT_SERVER_IDLE_S"
IDLE_S = 600.0  # with no run for this long, leave: an idle server holds about 300 MB (torch's libraries)
MAX_REQUEST = 1 << 20  # what the server reads of one request (an environment and a command line: far less)
REAP_EVERY_S = 0.05  # while runs go on: how soon an agent killed by a signal is reported
NOT_FORKABLE = 3  # the exit code that tells the launcher not to start servers for this Python again


def send(run: socket.socket | int, **news: int) -> None:
    """One line on a run's socket: ``{"pid": ...}`` first, then ``{"exit": ...}`` (negative: a signal)."""
    line = (json.dumps(news) + "\n").encode()
    with contextlib.suppress(OSError):  # the launcher closed its end: nobody waits for this run's news
        run.sendall(line) if isinstance(run, socket.socket) else os.write(run, line)


def report_ended_children(runs: dict[int, socket.socket]) -> None:
    """Report each agent that has ended (its exit code, negative for a signal) and forget it."""
    for pid, status in ended_children() if runs else ():
        run = runs.pop(pid, None)
        if run is not None:
            send(run, exit=os.waitstatus_to_exitcode(status))
            run.close()


def serve(channel: socket.socket, idle_s: float) -> None:
    """Fork one agent per request until the channel closes and every agent has ended, or idle for `idle_s`."""
    runs: dict[int, socket.socket] = {}
    accepting = True
    while accepting or runs:
        idle = not runs
        readable, _, _ = select.select(
            [channel] if accepting else [], [], [], idle_s if idle else REAP_EVERY_S
        )
        report_ended_children(runs)
        if not readable:
            if idle:  # idle for idle_s: a request sent meanwhile is dropped with the channel,
                break  # and the launcher starts that run's agent afresh
            continue
        try:
            data, fds, _, _ = socket.recv_fds(channel, MAX_REQUEST, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            accepting = False  # the launcher is gone or done: finish the runs under way, then leave
            channel.close()
            continue
        try:
            start_agent(runs, json.loads(data), fds, [channel.fileno(), *(r.fileno() for r in runs.values())])
        except Exception:  # noqa: BLE001 - one request failed (a fork refused): serve the next ones
            traceback.print_exc()  # the launcher reads end-of-file on that run and starts it afresh
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


def preload() -> None:
    """Import what torchrun's agent imports, and the agent itself: a fork has nothing left to import."""
    import torch.distributed.run  # noqa: F401
    from torch.distributed.elastic.agent.server import local_elastic_agent  # noqa: F401
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous  # noqa: F401

    from ddp_helpers.kernel.launcher import torchrun_agent  # noqa: F401


def become_agent(request: dict[str, Any], output_fd: int, lifeline_fd: int, close: list[int]) -> int:
    """In the forked child: become the run's agent, as if started by ``python -m ...torchrun_agent``."""
    from ddp_helpers.kernel.launcher import torchrun_agent

    os.setsid()  # a session of its own: the run can be signalled as a group, as start_run's Popen does
    for fd in close:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(output_fd, 1)  # sys.stdout and sys.stderr (unbuffered: PYTHONUNBUFFERED) now write to the log
    os.dup2(output_fd, 2)
    os.close(output_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[torchrun_agent.OWNER_FD_ENV] = str(lifeline_fd)
    sys.argv = [torchrun_agent.__file__, *request["argv"]]
    return torchrun_agent.main(request["argv"])


def start_agent(
    runs: dict[int, socket.socket], request: dict[str, Any], fds: list[int], close: list[int]
) -> None:
    """Fork one run's agent and send its pid on the run's socket, where the agent's exit code follows."""
    # the agent writes its own exit code too, so the launcher learns it if this server dies first
    run_fd, output_fd, lifeline_fd = fds
    pid = os.fork()
    if pid == 0:  # the child leaves with its code, never returning into the loop here
        code = 1
        try:
            os.set_inheritable(run_fd, False)  # a message's fds are inheritable: not to the workers
            code = become_agent(request, output_fd, lifeline_fd, close)
        except BaseException:  # noqa: BLE001 - reported in the run's log, like a crash at start-up
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):  # the log or the socket is gone: the server reports
                sys.stdout.flush()
                sys.stderr.flush()
                send(run_fd, exit=code)
            os._exit(code)
    os.close(output_fd)
    os.close(lifeline_fd)
    runs[pid] = socket.socket(fileno=run_fd)
    send(runs[pid], pid=pid)


def main() -> None:
    channel = socket.socket(fileno=int(os.environ.pop(SERVER_FD_ENV)))
    preload()
    if len(os.listdir("/proc/self/task")) != 1:  # a thread started at import (an MKL numpy, a newer torch)
        sys.exit(NOT_FORKABLE)
    serve(channel, float(os.environ.get(IDLE_ENV, IDLE_S)))
    # Leave at once: finalizing an interpreter that holds torch takes a second or more on a loaded
    # machine, and an interrupted launch waits for this process to be gone. Nothing here needs flushing.
    os._exit(0)


if __name__ == "__main__":
    main()
