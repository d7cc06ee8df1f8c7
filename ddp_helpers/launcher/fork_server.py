"""The agent server's fork machinery, and the asking end.

A fork server is a process that has imported torch, runs one thread, and forks a child per request
that comes over its channel (a Unix socket): `serve`, with a `StartFork` that says what the child
becomes. agent_server.py serves torchrun's agents (asked by agent_client.py, in the launcher). A request
is one message with file descriptors (SCM_RIGHTS), the child's own socket first (`request_fork`). On
that socket the server writes the child's pid, then its exit code when it ends (`ForkedAgent` reads them).

Here, apart from agent_server.py, which runs as ``__main__`` (``python -m``): the launcher imports this
end, and a module that runs as ``__main__`` must not be imported a second time under its own name.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import threading
import traceback
from collections.abc import Callable
from typing import TypedDict, TypeVar

from .run_process import ProcessKind

MAX_REQUEST = 1 << 20  # what the server reads of one request (an environment and a command line: far less)
MAX_REQUEST_BYTES = 100_000  # what the asking end sends: one datagram, well under the socket's ~200 kB
START_TIMEOUT_S = 300.0  # the first fork waits for the server to import torch: minutes on a slow disk


class AgentRequest(TypedDict):
    """One request, as JSON: the run's torchrun command line, its environment and its folder."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


class RunNews(TypedDict, total=False):
    """One line on a run's socket: the child's pid first, then its exit code (negative: a signal)."""

    pid: int
    exit: int


# (children by pid, the request, its fds, fds the child must close): forks the child, reports its pid
StartFork = Callable[[dict[int, socket.socket], AgentRequest, list[int], list[int]], None]


# ------------------------------------------------------------------------------- the server
def preload_torchrun() -> None:
    """Import what torchrun's agent imports, so that a fork has nothing left to import."""
    import torch.distributed.run  # noqa: F401
    from torch.distributed.elastic.agent.server import local_elastic_agent  # noqa: F401
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous  # noqa: F401


def one_thread() -> bool:
    """Only this thread runs here: what makes a fork safe."""
    return len(os.listdir("/proc/self/task")) == 1


def fork_child(
    runs: dict[int, socket.socket], run_fd: int, child: Callable[[], int], close_here: list[int]
) -> int:
    """Fork; the child runs `child` and leaves with its code, never returning into the loop here. This
    process closes `close_here` (the child's own fds), keeps `run_fd`, writes the child's pid there and
    returns it."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child()
        finally:
            os._exit(code)
    for fd in close_here:
        os.close(fd)
    run = socket.socket(fileno=run_fd)
    runs[pid] = run
    _send(run, {"pid": pid})
    return pid


def report_ended_children(runs: dict[int, socket.socket]) -> None:
    """Report each agent that has ended (its exit code, negative for a signal) and forget it."""
    while runs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        run = runs.pop(pid, None)
        if run is not None:
            _send(run, {"exit": os.waitstatus_to_exitcode(status)})
            run.close()


def _send(run: socket.socket, message: RunNews) -> None:
    try:
        run.sendall((json.dumps(message) + "\n").encode())
    except OSError:  # the launcher closed its end: nobody waits for this run's news
        pass


def serve(channel: socket.socket, idle_s: float | None, start: StartFork) -> None:
    """Fork one child per request (`start` forks it: a run's agent) until the channel closes
    and every child has ended, or nothing has run for `idle_s` seconds (None: never idle out)."""
    runs: dict[int, socket.socket] = {}
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # a SIGCHLD wakes the select below at once
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    accepting = True
    while accepting or runs:
        watched: list[int | socket.socket] = [wake_read, channel] if accepting else [wake_read]
        readable, _, _ = select.select(watched, [], [], (idle_s if not runs else None) if accepting else 1.0)
        if accepting and not readable and not runs:  # idle for idle_s: a request sent meanwhile is
            break  # dropped with the channel, and the launcher starts that run's agent afresh
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 4096):
                        break
                except BlockingIOError:
                    break
        report_ended_children(runs)
        if channel in readable:
            try:
                data, fds, _, _ = socket.recv_fds(channel, MAX_REQUEST, 3)
            except OSError:
                data, fds = b"", []
            if not data:
                accepting = False  # the launcher is gone or done: finish the runs under way, then leave
                channel.close()
                continue
            if len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                continue
            others = [channel.fileno(), wake_read, wake_write, *(run.fileno() for run in runs.values())]
            try:
                start(runs, json.loads(data), fds, others)
            except Exception:  # noqa: BLE001 - one request failed (a fork refused): serve the next ones
                traceback.print_exc()  # the launcher reads end-of-file on that run and starts it afresh
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass


# ------------------------------------------------------------------------------- the asking end
class ServerGone(Exception):
    """The server died, left (idle), or did not answer in time: start the run's agent afresh."""


Forked = TypeVar("Forked", bound="ForkedAgent")


def request_fork(
    channel: socket.socket,
    lock: threading.Lock,
    request: bytes,
    fds: list[int],
    kind: type[Forked],
    timeout_s: float = START_TIMEOUT_S,
) -> Forked:
    """Send one fork request (with the new child's own socket first, then `fds`) and wait for its pid.
    Raises `ServerGone` if the server is gone, or went before it answered."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with lock:
            socket.send_fds(channel, [request], [theirs.fileno(), *fds])
    except OSError as error:
        ours.close()
        raise ServerGone from error
    finally:
        theirs.close()  # the server holds its own copy now: if it dies, `ours` reads end-of-file
    child = kind(ours)
    if not child.read_pid(timeout_s):
        child.close()
        raise ServerGone
    return child


class ForkedAgent:
    """A run's agent forked by the server: what `processes` needs of a Popen (pid, returncode)."""

    def __init__(self, run_socket: socket.socket) -> None:
        self.pid = 0
        self.kind: ProcessKind = "forked"  # see run_process.RunProcess
        self.returncode: int | None = None
        self.status_lost = False  # killed by a signal after its server died: the exit code is unknown
        self.wait_s = 0.0  # how long the launch waited for the fork (a cold server: its import of torch)
        self._socket = run_socket
        self._buffer = b""

    def read_pid(self, timeout_s: float) -> bool:
        """Wait for the server's word that the agent runs; False if it went without saying so."""
        self._socket.settimeout(timeout_s)
        try:
            while not self.pid:
                message = self._next_message()
                if message is None:
                    return False
                self._take(message)  # a fast agent's exit code may come before its pid
        except (TimeoutError, OSError):
            return False
        finally:
            self._socket.setblocking(False)
        return True

    def poll(self) -> int | None:
        """The agent's exit code (negative: the signal that ended it), or None while it runs."""
        while self.returncode is None:
            try:
                message = self._next_message()
            except BlockingIOError:
                return None
            if message is None:  # the server and the agent are gone, and neither said how it ended:
                self.returncode, self.status_lost = 1, True  # killed by a signal after the server died
            else:
                self._take(message)
        self.close()
        return self.returncode

    def _take(self, message: RunNews) -> None:
        if "pid" in message:
            self.pid = int(message["pid"])
        if "exit" in message and self.returncode is None:  # the agent's own word, or the server's
            self.returncode = int(message["exit"])

    def _next_message(self) -> RunNews | None:
        """The next message, or None at end-of-file (the server is gone)."""
        while b"\n" not in self._buffer:
            data = self._socket.recv(4096)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: RunNews = json.loads(line)  # written by `_send`, or by the agent as it leaves
        return message

    def close(self) -> None:
        self._socket.close()
