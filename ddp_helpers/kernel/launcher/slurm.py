"""Submit a generated sbatch script to a SLURM cluster from a cell, and follow it to its end.

`submit` runs ``sbatch``; `follow` reads the job's log as it grows and echoes each rank's line as
``[rank N] ...``, as `launch` does (the script's torchrun tees every rank's output into the log with
a ``[rankN]:`` prefix), polls ``squeue`` until the job leaves the queue, and returns what
``scontrol show job`` says about it: its nodes, state and exit code. A job that runs past its bound
is cancelled (``scancel``) and `SlurmTimeout` is raised.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddp_helpers.kernel.launcher.cell_output import write_line
from ddp_helpers.kernel.launcher.log_follow import FileFollower

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
RANK_LINE = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")  # ch06_trainjob.LOG_LINE_PREFIX
DEFAULT_CONF = "/etc/slurm/slurm.conf"  # where the client looks when SLURM_CONF is not set
QUERY_TIMEOUT_S = 15  # one sbatch/squeue/scontrol call; the controller answers in milliseconds when up


class SlurmTimeout(TimeoutError):
    """A job did not end within its bound; it was cancelled."""


@dataclass
class SlurmJob:
    """A finished job: what scontrol says about it, and its log's lines, every rank's apart."""

    job_id: int
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: str  # "exit status:signal", as scontrol writes it: "0:0" is success
    node_list: str  # e.g. n[1-2]
    num_nodes: int
    facts: dict[str, str]  # every field of `scontrol show job`
    lines: list[str] = field(default_factory=list)  # the whole log, as written
    rank_lines: dict[int, list[str]] = field(default_factory=dict)  # rank -> its lines, prefix removed


def _ask(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, env=env)


def missing_reason() -> str | None:
    """Why no SLURM cluster can take a job from here, or None when one answers."""
    absent = [name for name in COMMANDS if shutil.which(name) is None]
    if absent:
        return f"no SLURM client here ({', '.join(absent)} not on PATH)"
    try:
        probe = _ask("sinfo", "-h", "-o", "%P %a")
    except subprocess.TimeoutExpired:
        return "sinfo found no controller within 15 s"
    if probe.returncode != 0:
        if "SLURM_CONF" not in os.environ and not Path(DEFAULT_CONF).exists():
            return f"no cluster configured: SLURM_CONF is not set and {DEFAULT_CONF} does not exist"
        first = ((probe.stderr or probe.stdout).strip().splitlines() or ["no answer"])[0]
        return f"sinfo found no controller: {first[:200]}"
    if " up" not in probe.stdout:
        return "the SLURM controller answers, but no partition is up"
    return None


def job_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to submit with (sbatch passes it on): this Python's bin folder first on PATH, so
    the job's ``torchrun`` is the one beside this interpreter, with the same torch."""
    env = dict(os.environ if environ is None else environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def submit(
    script: str | os.PathLike[str], *, chdir: str | os.PathLike[str], log: str | os.PathLike[str]
) -> int:
    """``sbatch`` `script`, run from `chdir` (relative worker paths are relative to it); returns the job id."""
    where = f"--chdir={Path(chdir).resolve()}", f"--output={Path(log).resolve()}"
    proc = _ask("sbatch", "--parsable", *where, str(Path(script).resolve()), env=job_environment())
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch refused the job: {proc.stderr.strip()}")
    return int(proc.stdout.strip().split(";")[0])


def job_facts(job_id: int) -> dict[str, str]:
    """``scontrol show job -o``, as a dict (empty once the controller has forgotten the job)."""
    proc = _ask("scontrol", "show", "job", "-o", str(job_id))
    return dict(re.findall(r"(\w[\w:/]*)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}


def in_queue(job_id: int) -> bool:
    """Whether ``squeue`` still lists the job (pending, running or completing)."""
    proc = _ask("squeue", "-h", "-j", str(job_id), "-o", "%T")
    return proc.returncode == 0 and bool(proc.stdout.strip())


def follow(
    job_id: int, log: str | os.PathLike[str], *, timeout_s: float, echo: bool = True, poll_s: float = 0.5
) -> SlurmJob:
    """Echo the job's log as it grows until the job leaves the queue; return its facts and lines.

    Rank lines are echoed as ``[rank N] text``; the script's own lines as they are.
    Past `timeout_s` the job is cancelled and `SlurmTimeout` raised.
    """
    reader, lines = FileFollower(Path(log)), []
    deadline = time.monotonic() + timeout_s

    def take(new: list[str]) -> None:
        for line in new:
            lines.append(line)
            if echo:
                match = RANK_LINE.match(line)
                write_line(f"[rank {match[1]}] {match[2]}" if match else line)

    while in_queue(job_id):
        take(reader.read().lines)
        if time.monotonic() > deadline:
            subprocess.run(["scancel", str(job_id)], timeout=QUERY_TIMEOUT_S, check=False)
            raise SlurmTimeout(f"job {job_id} did not end within {timeout_s:g} s: cancelled")
        time.sleep(poll_s)
    take(reader.read(final=True).lines)
    facts = job_facts(job_id)
    rank_lines: dict[int, list[str]] = {}
    for line in lines:
        if match := RANK_LINE.match(line):
            rank_lines.setdefault(int(match[1]), []).append(match[2])
    nodes = re.match(r"\d+", facts.get("NumNodes", ""))  # "2", or "2-2" for a range
    return SlurmJob(
        job_id=job_id,
        state=facts.get("JobState", "UNKNOWN"),
        exit_code=facts.get("ExitCode", "?"),
        node_list=facts.get("NodeList", "?"),
        num_nodes=int(nodes.group()) if nodes else 0,
        facts=facts,
        lines=lines,
        rank_lines=dict(sorted(rank_lines.items())),
    )
