"""The launcher's side of the agent server (agent_server.py, docs/architecture.md): fork torchrun's agent warm.

`start_agent` returns None where no server can fork (not Linux, a dead or threaded server,
``DDP_HELPERS_AGENT_SERVER=off``): the launcher then starts a fresh agent."""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import threading
import time

from ddp_helpers.kernel.launcher.agent_server import IDLE_ENV, NOT_FORKABLE, SERVER_FD_ENV
from ddp_helpers.kernel.launcher.torchrun_agent import OWNER_FD_ENV

MAX_REQUEST_BYTES = 100_000  # what this end sends: one datagram, well under the socket's ~200 kB
START_TIMEOUT_S = 300.0  # the first fork waits for the server to import torch: minutes on a slow disk

# Read only at run time (by the agent or the workers), so one warm server forks runs that differ in them;
# also DDP_*. TORCH_DISTRIBUTED_DEBUG is read at import, but only the workers (fresh) use its level.
RUN_TIME_KEYS = {"OMP_NUM_THREADS", "MPLBACKEND", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", OWNER_FD_ENV}
RUN_TIME_KEYS |= {"PYTEST_CURRENT_TEST", "TORCH_DISTRIBUTED_DEBUG"}  # pytest's: new for every test
KEEP_SERVERS = 2
SWITCH_ENV = "DDP_HELPERS_AGENT_SERVER"  # "off": no server, a fresh agent per launch (for comparing)
ServerKey = tuple[str, tuple[tuple[str, str], ...]]  # a Python, and the environment read at import


def _run_time(key: str) -> bool:
    return key in RUN_TIME_KEYS or key.startswith("DDP_")


# Popen.poll() takes a lock that CPython leaves held when a KeyboardInterrupt lands between its acquire and
# its try (an interrupted launch then waited forever for a zombie torchrun): ask the kernel, without it.
def reap(popen: subprocess.Popen[bytes]) -> int | None:
    """`popen`'s exit code (negative: its signal), or None while it runs; reaps it."""
    if popen.returncode is None:
        try:
            pid, status = os.waitpid(popen.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (SIGCHLD ignored): its status is lost, as Popen says
            pid, status = popen.pid, 0
        if pid == popen.pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
    return popen.returncode


class AgentServer:
    """One running agent_server process and this process's end of its channel."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {k: v for k, v in env.items() if not _run_time(k)}
        server_env[SERVER_FD_ENV] = str(theirs.fileno())
        if IDLE_ENV in env:
            server_env[IDLE_ENV] = env[IDLE_ENV]
        server_env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS pool: one thread, nothing to fork
        try:
            self.process = subprocess.Popen(
                [python, "-m", "ddp_helpers.kernel.launcher.agent_server"],
                env=server_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # a fork's own output goes to its run's log
                start_new_session=True,  # never signalled with the kernel's process group
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.channel = ours
        self.lock = threading.Lock()

    def fork(self, argv: list[str], env: dict[str, str], output_fd: int, lifeline_fd: int) -> ForkedAgent:
        """The run's agent, forked; `ServerGone` if the server is gone, or went before it answered."""
        message = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.channel, [message], [theirs.fileno(), output_fd, lifeline_fd])
        except OSError as error:
            ours.close()
            raise ServerGone from error
        finally:
            theirs.close()  # the server holds its own copy now: if it dies, `ours` reads end-of-file
        agent = ForkedAgent(ours)
        if not agent.read_pid(START_TIMEOUT_S):
            agent._socket.close()
            raise ServerGone
        return agent

    def alive(self) -> bool:
        return reap(self.process) is None

    def stop(self) -> None:
        """Close the channel: the server takes no new run and leaves when its runs have ended."""
        with self.lock:
            self.channel.close()


class ServerGone(Exception):
    """The server died, left (idle), or did not answer in time: start the run's agent afresh."""


class ForkedAgent:
    """A run's agent forked by the server: what `processes` needs of a Popen (pid, returncode)."""

    def __init__(self, run_socket: socket.socket) -> None:
        self.pid = 0
        self.kind = "forked"  # processes.RunProcess: "forked", "fresh" or "none"
        self.returncode: int | None = None
        self.status_lost = False  # killed by a signal after its server died: the exit code is unknown
        self.wait_s = 0.0  # how long the launch waited for the fork (a cold server: its import of torch)
        self._socket, self._buffer = run_socket, b""

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
        self._socket.close()
        return self.returncode

    def _take(self, message: dict[str, int]) -> None:
        self.pid = int(message.get("pid", self.pid))
        if "exit" in message and self.returncode is None:  # the agent's own word, or the server's
            self.returncode = int(message["exit"])

    def _next_message(self) -> dict[str, int] | None:
        """The next message, or None at end-of-file (the server is gone)."""
        while b"\n" not in self._buffer:
            data = self._socket.recv(4096)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, int] = json.loads(line)  # written by agent_server.send, by the server or the agent
        return message


def supported() -> bool:
    """Linux, and not turned off (``DDP_HELPERS_AGENT_SERVER=off``: every launch starts a fresh agent)."""
    if os.environ.get(SWITCH_ENV, "on").lower() in ("off", "0", "false", "no"):
        return False
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


class AgentServers:
    """This process's agent servers, by Python and environment; `stop_all` (at exit) tells them to leave."""

    def __init__(self) -> None:
        self.running: dict[ServerKey, AgentServer] = {}  # most recently used last
        self.stopped: list[subprocess.Popen[bytes]] = []  # told to leave, reaped when they have
        self.not_forkable: set[str] = set()  # Pythons whose server found threads after importing torch
        self._lock = threading.Lock()  # running, not_forkable
        self._stopped_lock = threading.Lock()

    def server(self, python: str, env: dict[str, str]) -> AgentServer | None:
        """The server for this Python and environment, started if needed; None where none can serve."""
        if not supported() or python in self.not_forkable:
            return None
        key = (python, tuple(sorted((k, v) for k, v in env.items() if not _run_time(k))))
        self.wait_for_stopped(0.0)
        with self._lock:
            server = self.running.pop(key, None)
            if server is not None and not server.alive():
                self._stop(server)
                server = None
            if server is None:
                try:
                    server = AgentServer(python, env)
                except OSError:
                    return None
            self.running[key] = server  # the most recently used; the least beyond KEEP_SERVERS leaves
            while len(self.running) > KEEP_SERVERS:
                self._stop(self.running.pop(next(iter(self.running))))
        return server

    def start_agent(
        self, python: str, argv: list[str], env: dict[str, str], output_fd: int, lifeline_fd: int
    ) -> ForkedAgent | None:
        """Fork the run's agent from a warm server; None where that cannot be done: start a fresh one."""
        too_big = len(json.dumps([argv, env])) > MAX_REQUEST_BYTES - 4096  # 4 kB: the folder
        server = None if too_big else self.server(python, env)
        if server is None:
            return None
        try:
            return server.fork(argv, env, output_fd, lifeline_fd)
        except (ServerGone, KeyboardInterrupt) as error:  # an interrupt while a cold server imports torch
            with self._lock:
                self.running = {k: s for k, s in self.running.items() if s is not server}
            server.process.kill()  # a request it still holds must never be forked
            self._stop(server)
            if server.process.wait() == NOT_FORKABLE:
                self.not_forkable.add(python)
            if isinstance(error, KeyboardInterrupt):
                raise
            return None

    def _stop(self, server: AgentServer) -> None:
        server.stop()
        with self._stopped_lock:
            self.stopped.append(server.process)

    def stop_all(self) -> None:
        """Let every server leave (each once its runs have ended). The next launch starts a fresh one."""
        with self._lock:
            while self.running:
                self._stop(self.running.popitem()[1])

    def wait_for_stopped(self, timeout_s: float) -> bool:
        """Reap the servers told to leave, waiting up to `timeout_s` for the rest; True if none is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._stopped_lock:
                self.stopped[:] = [p for p in self.stopped if reap(p) is None]
                if not self.stopped:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def reap_stopped_in_background(self, timeout_s: float = 60.0) -> None:
        """Reap, from a daemon thread, the servers told to leave that have not left yet (no zombie)."""
        if not self.wait_for_stopped(0.0):
            threading.Thread(target=self.wait_for_stopped, args=(timeout_s,), daemon=True).start()


SERVERS = AgentServers()  # this process's: the launcher's functions below use it
start_agent = SERVERS.start_agent
warm_up = SERVERS.server  # start the server a launch will use, without waiting for its imports
stop_servers = SERVERS.stop_all
wait_for_stopped_servers = SERVERS.wait_for_stopped
reap_stopped_servers_in_background = SERVERS.reap_stopped_in_background
atexit.register(SERVERS.stop_all)
