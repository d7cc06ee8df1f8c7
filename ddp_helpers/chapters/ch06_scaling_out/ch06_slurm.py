"""Submit an sbatch script from a cell and follow it: echo each ``[rankN]:`` line of its log as
``[rank N] ...``, poll ``squeue`` until it ends, and return what ``scontrol`` says (cancelled past its bound)."""

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
    """A finished job: every field of ``scontrol show job``, and its log's lines (every rank's apart)."""

    job_id: int
    facts: dict[str, str]
    lines: list[str]
    rank_lines: dict[int, list[str]]  # rank -> its lines, prefix removed
    state: str = field(init=False)  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: str = field(init=False)  # "exit status:signal": "0:0" is success
    num_nodes: int = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.facts.get("JobState", "UNKNOWN")
        self.exit_code = self.facts.get("ExitCode", "?")
        nodes = re.match(r"\d+", self.facts.get("NumNodes", ""))  # "2", or "2-2" for a range
        self.num_nodes = int(nodes.group()) if nodes else 0


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
    return None if " up" in probe.stdout else "the SLURM controller answers, but no partition is up"


def submit(
    script: str | os.PathLike[str], *, chdir: str | os.PathLike[str], log: str | os.PathLike[str]
) -> int:
    """``sbatch`` `script` from `chdir`; the job id. The job's torchrun is the one beside this Python."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    where = f"--chdir={Path(chdir).resolve()}", f"--output={Path(log).resolve()}"
    proc = _ask("sbatch", "--parsable", *where, str(Path(script).resolve()), env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch refused the job: {proc.stderr.strip()}")
    return int(proc.stdout.strip().split(";")[0])


def job_facts(job_id: int) -> dict[str, str]:
    """``scontrol show job -o`` as a dict (empty once the controller has forgotten the job)."""
    proc = _ask("scontrol", "show", "job", "-o", str(job_id))
    return dict(re.findall(r"(\w[\w:/]*)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}


def in_queue(job_id: int) -> bool:
    proc = _ask("squeue", "-h", "-j", str(job_id), "-o", "%T")
    return proc.returncode == 0 and bool(proc.stdout.strip())


def follow(
    job_id: int, log: str | os.PathLike[str], *, timeout_s: float, echo: bool = True, poll_s: float = 0.5
) -> SlurmJob:
    """Echo the job's log until the job leaves the queue; past `timeout_s`, cancel it (`SlurmTimeout`)."""
    reader, lines = FileFollower(Path(log)), []
    rank_lines: dict[int, list[str]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        queued = in_queue(job_id)
        for line in reader.read(final=not queued).lines:
            lines.append(line)
            match = RANK_LINE.match(line)
            if match:
                rank_lines.setdefault(int(match[1]), []).append(match[2])
            if echo:
                write_line(f"[rank {match[1]}] {match[2]}" if match else line)
        if not queued:
            return SlurmJob(job_id, job_facts(job_id), lines, dict(sorted(rank_lines.items())))
        if time.monotonic() > deadline:
            subprocess.run(["scancel", str(job_id)], timeout=QUERY_TIMEOUT_S, check=False)
            raise SlurmTimeout(f"job {job_id} did not end within {timeout_s:g} s: cancelled")
        time.sleep(poll_s)
