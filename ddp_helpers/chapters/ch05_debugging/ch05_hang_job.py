"""Notebook 05's planted hang for the hang tools (hang_tools.py): a case of the pitfalls worker under plain
torchrun, as on a cluster, with no workbench launcher.

Kernel side. `planted_hang` starts the job in a session of its own, through `WITH_TOOLS` (the lines a
training script can carry so that a hang can be read from outside: a Flight Recorder dump on a signal,
torch 2.14's debug server) or without it, waits until every rank waits, yields the job with each rank's
pid, and kills every process of it when the ``with`` block ends.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddp_helpers import run_contract
from ddp_helpers.chapters.ch05_debugging.ch05_pitfall_runs import printed
from ddp_helpers.kernel.launcher.config import default_run_dir
from ddp_helpers.kernel.launcher.process_tree import ProcessTree

FR_SIGNAL_OFFSET = 7  # with_tools.py's signal: SIGRTMIN + 7 (the workbench's stack dumps use + 6)
FR_PREFIX = "fr_rank_"  # each rank's Flight Recorder file: fr_rank_<rank>, as fr_trace's --prefix
DEBUG_SERVER = "torch.distributed.debug"

# The lines a training script carries for the tools (above `runpy`); the rest runs the script.
WITH_TOOLS = '''\
"""Run a training script with two hang tools in every rank:
torchrun --nproc-per-node N with_tools.py SCRIPT ARGS..."""
import os
import runpy
import signal
import sys
import threading

# 1. Flight Recorder on request: `kill -s RTMIN+7 PID` writes this rank's record to
# $FR_DUMP_PREFIX<rank>. The signal is blocked here, before any thread exists, so that every thread
# inherits the block and only sigwait below receives it (its default action ends a process).
FR_SIGNAL = signal.SIGRTMIN + 7
signal.pthread_sigmask(signal.SIG_BLOCK, {FR_SIGNAL})


def dump_flight_recorder_on_signal() -> None:
    from torch._C import _distributed_c10d as c10d

    path = os.environ["FR_DUMP_PREFIX"] + os.environ["RANK"]
    while True:
        signal.sigwait({FR_SIGNAL})
        record = c10d._dump_fr_trace()  # torch 2.14: gloo's record (NCCL keeps its own)
        with open(path + ".partial", "wb") as f:
            f.write(record)
        os.replace(path + ".partial", path)


from torch._C import _distributed_c10d  # noqa: E402

if "FR_DUMP_PREFIX" in os.environ and hasattr(_distributed_c10d, "_dump_fr_trace"):
    threading.Thread(target=dump_flight_recorder_on_signal, daemon=True).start()

# 2. torch 2.14's debug server: every rank serves its stacks; rank 0 the pages, on DEBUG_SERVER_PORT
if "DEBUG_SERVER_PORT" in os.environ:
    from torch.distributed.debug import start_debug_server

    start_debug_server(port=int(os.environ["DEBUG_SERVER_PORT"]))

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@dataclass
class HungJob:
    """A torchrun job of the pitfalls worker whose ranks hang, and what the tools need of it."""

    worker: Path
    world: int
    run_dir: Path
    proc: subprocess.Popen[bytes]
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid
    debug_port: int | None = None  # the debug server's page, where torch has one (2.14)

    @property
    def fr_dir(self) -> Path:
        return self.run_dir / "flight-recorder"

    @property
    def with_tools(self) -> Path:
        return self.run_dir / "with_tools.py"


def debug_server_available() -> bool:
    """torch 2.14 has `torch.distributed.debug.start_debug_server`; torch 2.7 has no such module."""
    return importlib.util.find_spec(DEBUG_SERVER) is not None


def missing_for_debug_server() -> list[str]:
    """What the debug server needs that is not installed: jinja2 for its pages, tabulate for its Flight
    Recorder tables (imported with its handlers), aiohttp or requests to ask the ranks."""
    missing = [name for name in ("jinja2", "tabulate") if importlib.util.find_spec(name) is None]
    if not any(importlib.util.find_spec(name) for name in ("aiohttp", "requests")):
        missing.append("aiohttp")
    return missing


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rank_pids(agent_pid: int) -> dict[int, int]:
    """Each rank's pid, by rank: the agent's descendants whose environment holds RANK (what a learner
    reads with ``ps`` and ``/proc/PID/environ``). A rank's own children (the debug server's page) have
    its RANK too: the oldest process with a rank is the rank."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.Process(agent_pid).children(recursive=True):
        try:
            rank = int(proc.environ()["RANK"])
        except (KeyError, ValueError, psutil.Error):
            continue
        if rank not in found or proc.create_time() < found[rank].create_time():
            found[rank] = proc
    return {rank: proc.pid for rank, proc in sorted(found.items())}


@contextmanager
def planted_hang(
    worker: str | os.PathLike[str],
    world: int,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    case: str = "hang",
    with_tools: bool = True,
    env: Mapping[str, str] | None = None,
    startup_s: float = 120.0,
) -> Iterator[HungJob]:
    """Run `case` of the pitfalls `worker` on `world` ranks under plain torchrun, on gloo on the CPU
    (the tools read any backend; gloo runs on every machine), through `WITH_TOOLS` unless `with_tools`
    is False, and yield once every rank has printed its line and stopped. Every process of the job is
    killed when the block ends (and when this Python exits, should the block never end)."""
    run_dir = default_run_dir("hang-tools") if run_dir is None else Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an earlier run's dumps and logs would be read as this one's
    (run_dir / "flight-recorder").mkdir(parents=True)
    (run_dir / run_contract.LOGS_DIR).mkdir()
    ranks_env = {
        **os.environ,
        **(env or {}),
        "CUDA_VISIBLE_DEVICES": "",
        run_contract.BACKEND_ENV: "gloo",
        run_contract.DEVICE_ENV: "cpu",
        run_contract.RUN_DIR_ENV: str(run_dir),  # the workbench's stack dumps register in its logs/
    }
    port = None
    script = [str(worker)]
    if with_tools:
        (run_dir / "with_tools.py").write_text(WITH_TOOLS)
        script = [str(run_dir / "with_tools.py"), *script]
        ranks_env["FR_DUMP_PREFIX"] = str(run_dir / "flight-recorder" / FR_PREFIX)
        # torch 2.14: entries each rank's Flight Recorder keeps, gloo's too (2000, its default; 0: off). The
        # old name, TORCH_NCCL_TRACE_BUFFER_SIZE (torch 2.7: NCCL only, off by default), warns there
        ranks_env["TORCH_FR_BUFFER_SIZE"] = "2000"
        if debug_server_available() and not missing_for_debug_server():
            port = _free_port()
            ranks_env["DEBUG_SERVER_PORT"] = str(port)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    logs = [f"--log-dir={run_dir / run_contract.LOGS_DIR}", "--redirects=3"]  # each rank's own files
    command = [*torchrun, *logs, *script, "--case", case, "--pg-timeout", "600"]
    with open(run_dir / run_contract.LOGS_DIR / run_contract.AGENT_LOG, "wb") as log:
        proc = subprocess.Popen(
            command, env=ranks_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    tree = ProcessTree(proc.pid)
    stop = functools.partial(_stop, tree, proc)  # this job's own: unregistered by identity
    atexit.register(stop)
    try:
        job = HungJob(Path(worker), world, run_dir, proc, debug_port=port)
        _wait_until_hung(job, tree, startup_s)
        yield job
    finally:
        stop()
        atexit.unregister(stop)


def _stop(tree: ProcessTree, proc: subprocess.Popen[bytes]) -> None:
    """Every process of the job: SIGTERM, then SIGKILL after 2 s; torchrun's agent reaped."""
    tree.refresh()
    tree.terminate(grace_s=2.0)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def still_running(pids: Mapping[int, int]) -> dict[int, int]:
    """The ranks of `pids` (rank -> pid) whose process still runs (a zombie has ended: it runs no code)."""
    running = {}
    for rank, pid in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running[rank] = pid
        except psutil.NoSuchProcess:
            continue
    return running


def _wait_until_hung(job: HungJob, tree: ProcessTree, startup_s: float) -> None:
    """Until every rank has printed a line (the hang case prints one before it waits), then a moment
    for the waiting ranks to enter the collective; raises if the job ends or never gets there."""
    deadline = time.monotonic() + startup_s
    while not all(printed(job.run_dir, rank) for rank in range(job.world)):
        if job.proc.poll() is not None:
            raise RuntimeError(
                f"the job ended (exit {job.proc.returncode}): see {job.run_dir}/logs/torchrun.log"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank printed its first line within {startup_s:g} s")
        time.sleep(0.1)
    time.sleep(1.0)
    tree.refresh()
    job.pids = rank_pids(job.proc.pid)
    if sorted(job.pids) != list(range(job.world)):
        raise RuntimeError(f"found the pids of ranks {sorted(job.pids)}, not of all {job.world}")
