"""The hang tools a learner takes to a cluster (py-spy, Flight Recorder and fr_trace, torch 2.14's debug
server), pointed at one planted hang under plain torchrun. Kernel side.
"""

from __future__ import annotations

import atexit
import html
import importlib.util
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddp_helpers import run_contract
from ddp_helpers.chapters.ch05_debugging.ch05_pitfall_runs import printed
from ddp_helpers.kernel.launcher.config import default_run_dir
from ddp_helpers.kernel.launcher.machine import free_port
from ddp_helpers.kernel.launcher.processes import ProcessTree

FR_SIGNAL_OFFSET = 7  # with_tools.py's signal: SIGRTMIN + 7 (the workbench's stack dumps use + 6)
FR_PREFIX = "fr_rank_"  # each rank's Flight Recorder file: fr_rank_<rank>, as fr_trace's --prefix
DEBUG_SERVER = "torch.distributed.debug"
FR_MODULE = "torch.distributed.flight_recorder"  # torch 2.14's; its fr_trace reads the records

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

    world: int
    run_dir: Path
    proc: subprocess.Popen[bytes]
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid
    debug_port: int | None = None  # the debug server's page, where torch has one (2.14)

    @property
    def fr_dir(self) -> Path:
        return self.run_dir / "flight-recorder"


def missing_for_debug_server() -> list[str]:
    """What the debug server needs and lacks: torch 2.14's module, jinja2, tabulate, and aiohttp or requests."""
    missing = [
        name for name in (DEBUG_SERVER, "jinja2", "tabulate") if importlib.util.find_spec(name) is None
    ]
    if not any(importlib.util.find_spec(name) for name in ("aiohttp", "requests")):
        missing.append("aiohttp")
    return missing


def rank_pids(agent_pid: int) -> dict[int, int]:
    """Each rank's pid, by rank: the oldest descendant of the agent whose environment holds that RANK."""
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
    with_tools: bool = True,
) -> Iterator[HungJob]:
    """Run the pitfalls worker's hang case under plain torchrun on gloo; yield once every rank hangs.

    Every process of the job is killed when the block ends (or when this Python exits)."""
    run_dir = default_run_dir("hang-tools") if run_dir is None else Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an earlier run's dumps and logs would be read as this one's
    (run_dir / "flight-recorder").mkdir(parents=True)
    (run_dir / run_contract.LOGS_DIR).mkdir()
    ranks_env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        run_contract.BACKEND_ENV: "gloo",
        run_contract.DEVICE_ENV: "cpu",
        run_contract.RUN_DIR_ENV: str(run_dir),
        "FR_DUMP_PREFIX": str(run_dir / "flight-recorder" / FR_PREFIX),
        # torch 2.14: entries each rank's Flight Recorder keeps, gloo's too (2000, its default; 0: off). The
        # old name, TORCH_NCCL_TRACE_BUFFER_SIZE (torch 2.7: NCCL only, off by default), warns there
        "TORCH_FR_BUFFER_SIZE": "2000",
    }
    port = None if missing_for_debug_server() or not with_tools else free_port()
    if port is not None:
        ranks_env["DEBUG_SERVER_PORT"] = str(port)
    (run_dir / "with_tools.py").write_text(WITH_TOOLS)
    script = [str(run_dir / "with_tools.py"), str(worker)] if with_tools else [str(worker)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    logs = [f"--log-dir={run_dir / run_contract.LOGS_DIR}", "--redirects=3"]  # each rank's own files
    command = [*torchrun, *logs, *script, "--case", "hang", "--pg-timeout", "600"]
    with open(run_dir / run_contract.LOGS_DIR / run_contract.AGENT_LOG, "wb") as log:
        proc = subprocess.Popen(
            command, env=ranks_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    tree = ProcessTree(proc.pid)

    def stop() -> None:  # every process of the job: SIGTERM, then SIGKILL after 2 s; torchrun's agent reaped
        tree.terminate(grace_s=2.0)  # it looks for new descendants first
        proc.wait(timeout=10)

    atexit.register(stop)  # this job's own: unregistered by identity
    try:
        job = HungJob(world, run_dir, proc, debug_port=port)
        _wait_until_hung(job, tree, startup_s=120.0)
        yield job
    finally:
        stop()
        atexit.unregister(stop)


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
    """Until every rank has printed its line, then a moment to enter the collective; raises if the job ends."""
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


# ---- the tools ------------------------------------------------------------------------------------

_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]+):(?P<line>\d+)\)$")
_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)$')


@dataclass(frozen=True)
class Wait:
    """Where one rank waits, as a tool saw it."""

    innermost: str  # the innermost Python function: all_reduce, for a rank waiting in that collective
    own_line: str  # the worker's own innermost source line ("" if its file is not on the stack)


def flight_recorder_dumps_gloo() -> bool:
    """torch 2.14 records gloo's collectives and dumps them with `_dump_fr_trace`; torch 2.7 neither."""
    from torch._C import _distributed_c10d

    return hasattr(_distributed_c10d, "_dump_fr_trace")


def fr_trace_available() -> bool:
    """The analyser ships with torch 2.14 (``python -m torch.distributed.flight_recorder.fr_trace``)."""
    return importlib.util.find_spec(FR_MODULE) is not None


# ---- py-spy ---------------------------------------------------------------------------------------


def py_spy() -> str | None:
    """The py-spy command: in this Python's environment (the test extra installs it), or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def py_spy_dumps(job: HungJob) -> dict[int, str]:
    """``py-spy dump --pid PID`` on each rank, by rank (in a container it needs SYS_PTRACE)."""
    command = py_spy()
    if command is None:
        raise FileNotFoundError("py-spy is not installed: pip install py-spy")
    dumps = {}
    for rank, pid in job.pids.items():
        done = subprocess.run(
            [command, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        dumps[rank] = done.stdout if done.returncode == 0 else f"py-spy failed: {done.stderr.strip()}"
    return dumps


def py_spy_waits(dumps: Mapping[int, str], worker: Path) -> dict[int, Wait]:
    """Each rank's `Wait` from the main thread of its py-spy dump."""
    waits = {}
    for rank, dump in dumps.items():
        dump = _ANSI_COLOUR.sub("", dump)  # a terminal's colours, where py-spy printed them
        main = dump.split('"MainThread"', 1)[-1].split("\nThread ", 1)[0]
        waits[rank] = _wait(_frames(_PY_SPY_FRAME, main), worker)
    return waits


def _frames(frame: re.Pattern[str], text: str) -> list[tuple[str, str, int]]:
    """(function, file, line) of each line of `text` that `frame` matches, in order."""
    return [(m["func"], m["file"], int(m["line"])) for m in map(frame.match, text.splitlines()) if m]


def _wait(frames: list[tuple[str, str, int]], worker: Path) -> Wait:
    """A `Wait` from frames, innermost first; the worker's file is matched by name (py-spy shortens paths)."""
    if not frames:
        return Wait("", "")
    own = next((line for _, file, line in frames if Path(file).name == worker.name), None)
    source = worker.read_text().splitlines()
    own_line = source[own - 1].split("  # ")[0].strip() if own is not None and own <= len(source) else ""
    return Wait(frames[0][0].rsplit(".", 1)[-1], own_line)


# ---- Flight Recorder -----------------------------------------------------------------------------


def dump_flight_recorder(job: HungJob, wait_s: float = 20.0) -> dict[int, Path]:
    """Signal every rank to write its Flight Recorder record; each rank's file once written."""
    files = {rank: job.fr_dir / f"{FR_PREFIX}{rank}" for rank in job.pids}
    for pid in job.pids.values():
        os.kill(pid, signal.SIGRTMIN + FR_SIGNAL_OFFSET)
    deadline = time.monotonic() + wait_s
    while not all(path.exists() for path in files.values()):
        if time.monotonic() > deadline:
            missing = [rank for rank, path in files.items() if not path.exists()]
            raise TimeoutError(f"ranks {missing} wrote no Flight Recorder record within {wait_s:g} s")
        time.sleep(0.1)
    return files


def name_gloo_groups(fr_dir: Path, out_dir: Path) -> list[str]:
    """Copy each rank's record into `out_dir` with its gloo groups named; returns the names given.

    torch 2.14's gloo files a group's ranks under "" (`_create_gloo_process_group` names it later), so
    fr_trace finds no group "0"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    named: set[str] = set()
    for path in sorted(fr_dir.glob(f"{FR_PREFIX}*")):
        record = pickle.loads(path.read_bytes())
        unnamed = record["pg_config"].get("")
        for name, desc in {tuple(entry["process_group"]) for entry in record["entries"]}:
            if unnamed is not None and name not in record["pg_config"]:
                record["pg_config"][name] = {**unnamed, "name": name, "desc": desc}
                named.add(name)
        (out_dir / path.name).write_bytes(pickle.dumps(record))
    return sorted(named)


def run_fr_trace(fr_dir: Path) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix fr_rank_``, as a learner runs it."""
    command = [sys.executable, "-m", f"{FR_MODULE}.fr_trace", str(fr_dir), "--prefix", FR_PREFIX]
    # its report goes to its logger, on stderr: one stream, as a terminal shows it
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def fr_trace_finding(report: str) -> tuple[str, frozenset[int]] | None:
    """The collective fr_trace says not every rank joined, and the missing ranks; None if none."""
    block = report.split("Not all ranks joining collective", 1)
    if len(block) < 2:
        return None
    collective = re.search(r"^collective: (\S+)$", block[1], re.MULTILINE)
    missing = re.search(r"^missing ranks: \{([\d, ]*)\}$", block[1], re.MULTILINE)
    if not (collective and missing):
        return None
    ranks = frozenset(int(r) for r in missing[1].split(",") if r.strip())
    return collective[1], ranks


# ---- the debug server (torch 2.14) ----------------------------------------------------------------


def debug_server_page(job: HungJob, path: str = "/stacks", wait_s: float = 30.0) -> str:
    """A page of the debug server (rank 0 serves it on `job.debug_port`), as text; waits for it to come up."""
    url = f"http://localhost:{job.debug_port}{path}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=wait_s) as page:
                return str(page.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def debug_server_stacks(page: str) -> dict[int, str]:
    """Each rank's section of the stacks page ("Rank N: ADDRESS", then faulthandler's dump), by rank."""
    sections = re.findall(r"<h2>\s*Rank (\d+):.*?</h2>.*?<pre>(.*?)</pre>", page, re.DOTALL)
    return {int(rank): html.unescape(text) for rank, text in sections}


def faulthandler_waits(stacks: Mapping[int, str], worker: Path) -> dict[int, Wait]:
    """Each rank's `Wait` from a faulthandler dump: the main thread is the one with the script's frames."""
    waits = {}
    for rank, dump in stacks.items():
        threads = re.split(
            r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", dump, flags=re.M
        )
        candidates = [frames for thread in threads if (frames := _frames(_FAULTHANDLER_FRAME, thread))]
        main = next((f for f in candidates if any(Path(file).name == worker.name for _, file, _ in f)), [])
        waits[rank] = _wait(main, worker)
    return waits
