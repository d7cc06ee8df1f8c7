"""torchrun's workers, forked from a copy of the agent that has torch imported, where no GPU is visible.

Every worker that torchrun starts is ``python -u script.py``: a fresh interpreter that imports torch
before the script's first line runs (2.8 to 3.2 CPU-seconds each here, torch 2.14: most of a small
launch's time). Where the launcher asks for it (``DDP_HELPERS_WORKER_FORK=1``, which it sets when the
machine has no visible GPU), the agent forks a *worker fork server* before it does anything else: a
child of the agent with torch imported and one thread. torchrun's `SubprocessHandler` then gets each
worker from it instead of from ``subprocess.Popen``. The fork server forks the worker, which becomes
what ``python -u script.py`` would have been, and reports its pid and then its exit code.

What a forked worker shares with a fresh one:
- its own session (``start_new_session``), its stdout and stderr files, the environment torchrun built
  for it, its folder, ``sys.argv``, ``sys.path[0]`` (the script's folder), ``__main__``, unbuffered output;
- an uncaught exception prints its traceback (through ``sys.excepthook``, torch's ``[rankN]:`` one
  included) and exits with 1, ``sys.exit`` gives its code, Ctrl-C ends it by SIGINT;
- at the end, non-daemon threads are joined and ``atexit`` functions run, as Python's exit does;
- ``OMP_NUM_THREADS`` sets torch's threads (it was read when torch was imported: set again here), and
  numpy's global random state is seeded afresh, as each fresh process seeds it.

Where it differs, and why that is allowed here:
- ``ps``, ``/proc/PID/cmdline`` and ``/proc/PID/environ`` show the agent server's command line and
  environment (the launcher reads a forked worker's rank from `PIDS_FILE`); ``os.getppid()`` is the
  fork server, not the agent;
- the interpreter is not finalized: after the ``atexit`` functions the script's globals are freed (an
  unclosed file still writes its tail) and the process ends with ``os._exit``; objects held elsewhere
  are not destroyed;
- torch, torchrun and this package's launcher modules are imported already (an edit to those needs a
  new server: it leaves after 10 idle minutes); all workers share one string-hash seed and
  multiprocessing's authkey; numpy's BLAS keeps the server's one thread; warnings printed while torch
  was imported are not printed again.
Where a GPU is visible none of this is used: a fork must never follow a CUDA initialisation, and there
the workers are torchrun's own fresh interpreters.
``DDP_HELPERS_WORKER_FORK=off`` turns it off everywhere; a command that is not ``python -u script``
(``--no-python``, ``-m module``, ``PYTHON_EXEC``) is started by torchrun as always.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from .fork_server import (
    AGENT_ONLY_FDS,
    MAX_REQUEST_BYTES,
    ForkedAgent,
    ServerGone,
    fork_child,
    one_thread,
    preload_torchrun,
    request_fork,
    serve,
)
from .forked_worker import become_worker

SWITCH_ENV = "DDP_HELPERS_WORKER_FORK"  # "1": fork this run's workers (set by the launcher, see config.py)
# In the run's logs/: one JSON line per forked worker, {"pid", "rank", "local_rank"}. A fork's
# /proc/PID/environ still shows the server's environment, so the launcher learns its rank from here.
PIDS_FILE = "forked_workers.jsonl"
REPORT_WAIT_S = 2.0  # a dead worker's exit code, from its fork server: milliseconds, unless it is gone
FORK_TIMEOUT_S = 30.0  # the server is warm and one fork takes milliseconds: longer means it is stuck


def forked_ranks(log_dir: Path) -> dict[int, dict[str, int]]:
    """What the fork server wrote: each forked worker's rank and local rank, by pid."""
    try:
        lines = (log_dir / PIDS_FILE).read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        try:
            entry = json.loads(line)
            found[int(entry["pid"])] = {"rank": int(entry["rank"]), "local_rank": int(entry["local_rank"])}
        except (ValueError, KeyError, TypeError):  # a line being written: read again next time
            continue
    return found


# ------------------------------------------------------------------------------- in the agent
class ForkedWorker(ForkedAgent):
    """A worker from the fork server: what torchrun's `SubprocessHandler` uses of a Popen."""

    args: list[str] = []

    def poll(self) -> int | None:
        """As Popen's: the exit code as soon as the worker has died. (Its fork server reports it a moment
        later: torchrun, which polls its ranks in turn, would otherwise see a rank that lost its peer fail
        before the rank that died first, and name the wrong root cause.)"""
        code = super().poll()
        if code is None and not _alive(self.pid):
            select.select([self._socket], [], [], REPORT_WAIT_S)
            code = super().poll()
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerForks:
    """The agent's end of its fork server, and the patch that makes torchrun use it."""

    def __init__(self, channel: socket.socket, server_pid: int) -> None:
        self.channel = channel
        self.server_pid = server_pid
        self.lock = threading.Lock()
        self.gone = False
        self.workers: list[ForkedWorker] = []

    def fork(self, args: tuple, env: dict[str, str], handler: Any) -> ForkedWorker | None:
        """The worker for torchrun's command `args`, or None: torchrun starts that one itself."""
        command = [str(a) for a in args]
        if self.gone or len(command) < 3 or command[:2] != [sys.executable, "-u"] or command[2] == "-m":
            return None
        request = json.dumps({"argv": command[2:], "env": env, "cwd": os.getcwd()}).encode()
        if len(request) > MAX_REQUEST_BYTES:
            return None
        outputs = [
            stream.fileno() if stream is not None else default
            for stream, default in (
                (getattr(handler, "_stdout", None), 1),
                (getattr(handler, "_stderr", None), 2),
            )
        ]
        try:
            worker = request_fork(self.channel, self.lock, request, outputs, ForkedWorker, FORK_TIMEOUT_S)
        except ServerGone:
            # the next workers start as torchrun starts them; a request the server still holds must
            # never become a second copy of this rank
            self.gone = True
            _kill(self.server_pid)
            return None
        worker.args = command
        self.workers.append(worker)
        return worker

    def install(self) -> None:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

        popen = subprocess_handler.SubprocessHandler._popen
        forks = self

        def forked_popen(handler: Any, args: tuple[Any, ...], env: dict[str, str]) -> Any:
            return forks.fork(args, env, handler) or popen(handler, args, env)

        # Patches of torch's class, which is what this module is for (a fork is not a Popen): a type
        # checker refuses any assignment to a method.
        handler_class = subprocess_handler.SubprocessHandler
        handler_class._popen = forked_popen  # type: ignore[method-assign,assignment]
        handler_class.close = _tolerant_close(handler_class.close)  # type: ignore[method-assign]

    def close(self) -> None:
        """No more workers: SIGTERM any that torchrun left running (they are not the agent's children,
        so its own stop does not reach them), and the fork server leaves once they have ended."""
        for worker in self.workers:
            if worker.poll() is None:
                _signal_group(worker.pid, signal.SIGTERM)
        self.channel.close()


def _tolerant_close(close: Any) -> Any:
    """torchrun stops a worker with ``os.killpg(pid)``. A forked worker may not lead its group yet (it
    calls setsid just after the fork) or may be reaped already (its exit code on its way): signal the
    process itself then, or nothing, instead of letting ProcessLookupError end the agent."""

    def close_forked(handler: Any, death_sig: Any = None) -> None:
        try:
            close(handler, death_sig)
        except ProcessLookupError:
            if not isinstance(handler.proc, ForkedWorker):
                raise
            _kill(handler.proc.pid, death_sig or signal.SIGTERM)
            for stream in (handler._stdout, handler._stderr):
                if stream is not None:
                    stream.close()

    return close_forked


def _alive(pid: int) -> bool:
    """Running still: neither a zombie waiting for its fork server's wait nor reaped already."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        _kill(pid, sig)


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def start_if_asked() -> WorkerForks | None:
    """In the agent, before anything starts a thread: fork the fork server, and route torchrun's
    workers to it. None where not asked for, not Linux, or this process already runs threads.

    Call it with SIGTERM blocked (the agent's SIGTERM raises): the fork server unblocks it once it
    ignores it, and the agent once it holds the result."""
    if os.environ.get(SWITCH_ENV) != "1" or not hasattr(socket, "send_fds"):
        return None
    preload_torchrun()  # a forked agent has it already; a fresh one imports what it will need anyway
    if not one_thread():
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server_pid = os.fork()
    if server_pid == 0:
        code = 1
        try:
            ours.close()
            for fd in AGENT_ONLY_FDS:
                os.close(fd)
            # A run being stopped signals every process of it: this one stays to report how each
            # worker ended, and leaves when the agent closes the channel and its workers are gone.
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            serve(theirs, None, start_worker)
            code = 0
        except BaseException:  # noqa: BLE001 - into the agent's log: the workers then fail to start
            traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    forks = WorkerForks(ours, server_pid)
    forks.install()
    return forks


# ------------------------------------------------------------------------------- in the fork server
def start_worker(runs: dict[int, socket.socket], request: dict, fds: list[int], close: list[int]) -> None:
    run_fd, stdout_fd, stderr_fd = fds
    pid = fork_child(
        runs,
        run_fd,
        lambda: _printing_errors(become_worker, request, stdout_fd, stderr_fd, [run_fd, *close]),
        close_here=[stdout_fd, stderr_fd],
    )
    env = request["env"]
    if "DDP_RUN_DIR" in env and "RANK" in env:
        entry = {"pid": pid, "rank": env["RANK"], "local_rank": env.get("LOCAL_RANK", env["RANK"])}
        try:
            with open(Path(env["DDP_RUN_DIR"]) / "logs" / PIDS_FILE, "a") as pids:
                pids.write(json.dumps(entry) + "\n")
        except OSError:  # the run's folder is gone: the launcher no longer samples this run
            pass


def _printing_errors(become: Any, *args: Any) -> int:
    try:
        return become(*args)
    except BaseException:  # noqa: BLE001 - a worker that could not start says why, in its stderr log
        traceback.print_exc()
        return 1
