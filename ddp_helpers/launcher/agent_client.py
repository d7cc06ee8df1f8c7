"""The launcher's side of the agent server (agent_server.py): torchrun's agent, forked warm.

`start_agent` asks this process's server to fork a run's agent, starting the server first when there
is none (`warm_up` starts one ahead, so that its import of torch overlaps other work). It returns None
where a fork cannot be used (not Linux, a server that died, cannot start or has threads): the launcher
then starts ``python -m ddp_helpers.launcher.torchrun_agent`` as a fresh process.
``DDP_HELPERS_AGENT_SERVER=off`` turns the server off.

A server serves one Python and one environment, because torch reads some variables when it is imported
(``LOGLEVEL``, ``TORCH_CPP_LOG_LEVEL``, ``PYTHON*``, ...). Only the variables the launcher sets for each
run, which are read later, may differ between a server and the runs it forks (`RUN_TIME_KEYS`). A run
with other variables (``launch(env=...)``) gets a server of its own; the two most recently used are kept.

A server holds no run of its own. It leaves when this process closes its end of the channel (at exit,
in `stop_servers`, which an interrupted launch calls, or when a third server evicts it) or dies, and
after `agent_server.IDLE_S` seconds without a run.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import threading
import time

from .agent_server import IDLE_ENV, NOT_FORKABLE, SERVER_FD_ENV
from .fork_server import MAX_REQUEST_BYTES, ForkedAgent, ServerGone, request_fork
from .torchrun_agent import OWNER_FD_ENV

# Set by the launcher for each run and read only when the run uses them (by torchrun's agent at run
# time, or by the workers), so a warm server may fork runs that differ in them.
RUN_TIME_KEYS = frozenset(
    {
        "OMP_NUM_THREADS",
        "MPLBACKEND",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        OWNER_FD_ENV,
        "PYTEST_CURRENT_TEST",  # pytest names the running test there: a new value for every test
    }
)
RUN_TIME_PREFIX = "DDP_"  # this package's own variables: the grace period, the run's folder, live ranks
KEEP_SERVERS = 2
SWITCH_ENV = (
    "DDP_HELPERS_AGENT_SERVER"  # "off": no server, a fresh agent per launch (as before; for comparing)
)


def server_key(python: str, env: dict[str, str]) -> tuple:
    return (python, tuple(sorted((k, v) for k, v in env.items() if not _run_time(k))))


def _run_time(key: str) -> bool:
    return key in RUN_TIME_KEYS or key.startswith(RUN_TIME_PREFIX)


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
                [python, "-m", "ddp_helpers.launcher.agent_server"],
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

    def fork(
        self, argv: list[str], env: dict[str, str], output_fd: int, lifeline_fd: int
    ) -> ForkedAgent | None:
        """The run's agent, forked; None for a request too big for one message (an environment of
        megabytes). Raises `ServerGone` if the server is gone, or went before it answered."""
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        if len(request) > MAX_REQUEST_BYTES:
            return None
        return request_fork(self.channel, self.lock, request, [output_fd, lifeline_fd], ForkedAgent)

    def alive(self) -> bool:
        return self.process.returncode is None and _reap(self.process) is None

    def stop(self) -> None:
        """Close the channel: the server takes no new run and leaves when its runs have ended."""
        with self.lock:
            self.channel.close()
        with _stopped_lock:
            _stopped.append(self.process)

    def kill(self) -> None:
        """For a server that did not answer: a request it still holds must never be forked."""
        try:
            self.process.kill()
        except ProcessLookupError:
            pass
        self.stop()


def _reap(process: subprocess.Popen) -> int | None:
    try:
        pid, status = os.waitpid(process.pid, os.WNOHANG)
    except ChildProcessError:
        return process.returncode if process.returncode is not None else 0
    if pid == process.pid:
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode


_servers: dict[tuple, AgentServer] = {}  # most recently used last
_stopped: list[subprocess.Popen] = []  # servers told to leave, reaped when they have
_stopped_lock = threading.Lock()
_not_forkable: set[str] = set()  # Pythons whose server found threads after importing torch
_servers_lock = threading.Lock()


def supported() -> bool:
    """Linux, and not turned off (``DDP_HELPERS_AGENT_SERVER=off``: every launch starts a fresh agent)."""
    if os.environ.get(SWITCH_ENV, "on").lower() in ("off", "0", "false", "no"):
        return False
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


def start_agent(
    python: str, argv: list[str], env: dict[str, str], output_fd: int, lifeline_fd: int
) -> ForkedAgent | None:
    """Fork the run's agent from a warm server (started now if there is none for this Python and
    environment). None where that cannot be done: start a fresh agent instead."""
    if not supported() or len(json.dumps([argv, env])) > MAX_REQUEST_BYTES - 4096:  # 4 kB: the folder's name
        return None
    if python in _not_forkable:
        return None
    key = server_key(python, env)
    _reap_stopped()
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is not None and not server.alive():
            server.stop()
            server = None
        if server is None:
            try:
                server = AgentServer(python, env)
            except OSError:
                return None
        _servers[key] = server  # now the most recently used
        while len(_servers) > KEEP_SERVERS:
            _servers.pop(next(iter(_servers))).stop()
    try:
        return server.fork(argv, env, output_fd, lifeline_fd)
    except (ServerGone, KeyboardInterrupt) as error:  # an interrupt while a cold server imports torch
        with _servers_lock:
            if _servers.get(key) is server:
                del _servers[key]
        server.kill()
        if server.process.wait() == NOT_FORKABLE:
            _not_forkable.add(python)
        if isinstance(error, KeyboardInterrupt):
            raise
        return None


def warm_up(python: str, env: dict[str, str]) -> bool:
    """Start the server that a launch with this Python and environment will use, without waiting: it
    imports torch while this process does other work, and the first launch finds it ready. True if a
    server was started."""
    if not supported() or python in _not_forkable:
        return False
    key = server_key(python, env)
    with _servers_lock:
        if key in _servers:
            return False
        try:
            _servers[key] = AgentServer(python, env)
        except OSError:
            return False
        while len(_servers) > KEEP_SERVERS:
            _servers.pop(next(iter(_servers))).stop()
    return True


def stop_servers() -> None:
    """Let every server leave (each once its runs have ended). The next launch starts a fresh one."""
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].stop()


def _reap_stopped() -> bool:
    """Reap the servers that have left; True if none is left to wait for."""
    with _stopped_lock:
        _stopped[:] = [p for p in _stopped if _reap(p) is None]
        return not _stopped


def wait_for_stopped_servers(timeout_s: float) -> bool:
    """Wait until every server told to leave has; True if they all did (a server leaves once its
    runs, live ranks included, have ended)."""
    deadline = time.monotonic() + timeout_s
    while not _reap_stopped():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def reap_stopped_servers_in_background(timeout_s: float = 60.0) -> None:
    """Reap, from a daemon thread, the servers told to leave that have not left yet (none stays a zombie)."""
    if not _reap_stopped():
        threading.Thread(target=wait_for_stopped_servers, args=(timeout_s,), daemon=True).start()


atexit.register(stop_servers)
