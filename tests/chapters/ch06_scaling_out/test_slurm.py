"""The generated sbatch files, submitted to a real SLURM: munged, slurmctld and two slurmd on this machine.

`make test-slurm` installs Debian's slurm-wlm (scripts/install_slurm.sh) and runs these; the cluster
is started by scripts/start_slurm.sh in a temporary folder and stopped at the end, daemons and all.
Each node offers two fake GPUs (GRES with device files): SLURM binds them to jobs and tasks and sets
CUDA_VISIBLE_DEVICES as on a GPU cluster, but nothing can run on them, so the workers run on gloo and
report the CUDA device they would choose (`ddp_helpers.rank.distributed.gpu_index`), not use it.
Where SLURM cannot be installed (not root, no apt) the tests skip and say why; CI sets
REQUIRE_SLURM=1, and there a missing SLURM is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from ddp_helpers.chapters.ch06_scaling_out import ch06_slurm as slurm
from ddp_helpers.chapters.ch06_scaling_out.ch06_cluster_templates import (
    slurm_script,
    this_environment,
    write_cluster_templates,
)
from ddp_helpers.kernel.launcher.machine import free_port

REPO = Path(__file__).resolve().parents[3]
START = REPO / "scripts" / "start_slurm.sh"
DAEMONS = ("munged", "slurmctld", "slurmd")
NODES_UP_WITHIN_S = 60  # slurmd registers with slurmctld in a second or two; the rest is load
JOB_WITHIN_S = 240  # a 4-rank job imports torch in 6 processes: tens of seconds on 2 busy cores
GPUS_PER_NODE = 2  # start_slurm.sh's default SLURM_NODE_GPUS

# every rank adds rank + 1: the sum over the world is world * (world + 1) / 2 only if all took part.
# Each also says which CUDA device it would take among those SLURM let it see (there are no real ones)
WORKER = """\
import os
import torch
import torch.distributed as dist
from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import gpu_index

visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
local_rank = int(os.environ["LOCAL_RANK"])
device = f"cuda:{gpu_index(local_rank, len(visible.split(',')))}" if visible else "cpu"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank}/{world} on {os.environ['SLURMD_NODENAME']} group {os.environ.get('GROUP_RANK', '-')} "
      f"sum {total.item():g} local_rank {local_rank} CUDA_VISIBLE_DEVICES={visible or '-'} device {device}")
teardown.destroy_process_group()
"""
REPORT = re.compile(
    r"rank (\d+)/(\d+) on (\S+) group (\S+) sum (\S+) local_rank (\d+) CUDA_VISIBLE_DEVICES=(\S+) device (\S+)"
)


def _gpus_taken(reports: dict[int, tuple[str, ...]]) -> dict[str, list[str]]:
    """Each node's physical GPUs, one per rank: the CUDA_VISIBLE_DEVICES entry its device stands for.

    CUDA numbers the GPUs a process sees from 0, in CUDA_VISIBLE_DEVICES' order: cuda:i is its i-th
    entry. A device past the end of the list does not exist; two ranks of a node on one GPU collide."""
    taken: dict[str, list[str]] = {}
    for rank, (_, _, node, _, _, local_rank, visible, device) in sorted(reports.items()):
        index = int(device.removeprefix("cuda:"))
        gpus = visible.split(",")
        assert device.startswith("cuda:") and index < len(gpus), (
            f"rank {rank} (local rank {local_rank} on {node}) chose {device}, but it sees only "
            f"CUDA_VISIBLE_DEVICES={visible}"
        )
        taken.setdefault(node, []).append(gpus[index])
    return taken


def _missing(reason: str) -> None:
    # CI sets REQUIRE_SLURM=1: there, a missing SLURM is a failure, never a silent skip.
    if os.environ.get("REQUIRE_SLURM") == "1":
        pytest.fail(f"{reason}; REQUIRE_SLURM=1, so this is an error, not a skip")
    pytest.skip(reason)


def _daemons_of(folder: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] in DAEMONS and str(folder) in cmdline:
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def cluster():
    """A two-node SLURM cluster on this machine, for this module; stopped (and checked gone) after."""
    absent = [name for name in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(name) is None]
    if absent:
        _missing(
            f"SLURM is not installed ({', '.join(absent)} missing): `make test-slurm` installs it with apt, as root"
        )
    if os.geteuid() != 0:
        _missing(
            "the one-machine SLURM cluster runs its daemons as root (SlurmUser=root); this user is not root"
        )
    # a folder of its own, not under pytest's basetemp: pytest prunes old basetemps, even while in use
    folder = Path(tempfile.mkdtemp(prefix="ddp-slurm-cluster-"))
    env = {**os.environ, "SLURM_CTLD_PORT": str(free_port()), "SLURM_NODE_PORT": str(free_port())}
    saved = os.environ.get("SLURM_CONF")
    try:
        started = subprocess.run(
            ["bash", str(START), str(folder)], env=env, capture_output=True, text=True, timeout=60
        )
        assert started.returncode == 0, started.stderr
        os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
        deadline = time.monotonic() + NODES_UP_WITHIN_S
        while True:
            nodes = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=15
            )
            states = dict(line.split() for line in nodes.stdout.splitlines())
            if states.get("n1") == states.get("n2") == "idle":
                break
            assert time.monotonic() < deadline, f"nodes not idle within {NODES_UP_WITHIN_S}s: {nodes.stdout}"
            time.sleep(0.5)
        yield folder
    finally:
        subprocess.run(["bash", str(START), "--stop", str(folder)], timeout=60, check=False)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        left = _daemons_of(folder)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"daemons left running: {[p.pid for p in left]}"


def test_without_a_slurm_client_it_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no sinfo
    reason = slurm.missing_reason()
    assert reason is not None and reason.startswith("no SLURM client here (sbatch, squeue"), reason


def test_without_a_configured_cluster_it_says_so_in_one_line(monkeypatch):
    if shutil.which("sinfo") is None or Path(slurm.DEFAULT_CONF).exists():
        pytest.skip("needs the SLURM client and no system-wide slurm.conf")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert slurm.missing_reason() == (
        f"no cluster configured: SLURM_CONF is not set and {slurm.DEFAULT_CONF} does not exist"
    )


@pytest.mark.slurm
@pytest.mark.timeout(JOB_WITHIN_S + 120)
def test_generated_sbatch_file_runs_on_two_nodes_and_every_rank_all_reduces(cluster, tmp_path, capsys):
    """torchrun's job on two nodes with their GPUs: every local rank sees the node's GPUs, and takes
    its own, cuda:LOCAL_RANK. The rendezvous is on the first node of the list, at the job's own port."""
    (tmp_path / "worker.py").write_text(WORKER)
    paths = write_cluster_templates(
        tmp_path / "jobs",
        "worker.py",
        nnodes=2,
        nproc_per_node=2,
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_rank=1,
        time_limit="00:10:00",
        venv=this_environment(),
    )
    text = paths["slurm"].read_text()
    assert "MASTER_ADDR=" not in text  # torchrun sets it for its workers; an export would do nothing
    assert slurm.missing_reason() is None
    job_id = slurm.submit(paths["slurm"], chdir=tmp_path, log=tmp_path / "job.log")
    job = slurm.follow(job_id, tmp_path / "job.log", timeout_s=JOB_WITHIN_S)
    facts = (job.state, job.exit_code, job.num_nodes, job.facts.get("NodeList"))
    assert facts == ("COMPLETED", "0:0", 2, "n[1-2]"), job.lines
    reports = {
        int(m[1]): m.groups() for lines in job.rank_lines.values() for m in map(REPORT.search, lines) if m
    }
    assert sorted(reports) == sorted(job.rank_lines) == [0, 1, 2, 3], job.lines  # every rank ran, once
    assert all(world == "4" and float(total) == 10 for _, world, _, _, total, *_ in reports.values()), reports
    nodes = {node: sorted(r for r, (_, _, n, *_) in reports.items() if n == node) for node in ("n1", "n2")}
    assert sorted(map(len, nodes.values())) == [2, 2], nodes  # two ranks on each SLURM node
    # SLURM gave each agent (and so each of its ranks) the node's GPUs; each rank took one of its own
    assert all(report[6] == "0,1" for report in reports.values()), reports
    assert {node: sorted(gpus) for node, gpus in _gpus_taken(reports).items()} == {
        "n1": ["0", "1"],
        "n2": ["0", "1"],
    }
    # the cell's echo is launch()'s: `[rank N] ...`, one line per rank
    echoed = re.findall(r"^\[rank (\d)\] rank \d/4", capsys.readouterr().out, re.M)
    assert sorted(map(int, echoed)) == [0, 1, 2, 3]


@pytest.mark.slurm
@pytest.mark.timeout(JOB_WITHIN_S + 120)
def test_srun_recipe_shows_every_task_its_nodes_gpus_and_each_rank_takes_its_local_rank(cluster, tmp_path):
    """Notebook 06's srun without torchrun: every task of a node sees all the node's GPUs (no per-task
    cgroup to cost NCCL its NVLink, nccl#1066), and each rank takes cuda:LOCAL_RANK (SLURM_LOCALID)."""
    (tmp_path / "worker.py").write_text(WORKER)
    paths = write_cluster_templates(
        tmp_path / "jobs",
        "worker.py",
        nnodes=2,
        nproc_per_node=2,
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_rank=1,
        time_limit="00:10:00",
        venv=this_environment(),
    )
    job_id = slurm.submit(paths["srun"], chdir=tmp_path, log=tmp_path / "job.log")
    job = slurm.follow(job_id, tmp_path / "job.log", timeout_s=JOB_WITHIN_S, echo=False)
    assert (job.state, job.exit_code, job.num_nodes) == ("COMPLETED", "0:0", 2), job.lines
    reports = {int(m[1]): m.groups() for m in map(REPORT.search, job.lines) if m}
    assert sorted(reports) == [0, 1, 2, 3], job.lines  # every rank ran, once
    assert all(world == "4" and float(total) == 10 for _, world, _, _, total, *_ in reports.values()), reports
    # SLURM's binding: every task of a node sees both of the node's GPUs, none is fenced into one
    assert all(report[6] == "0,1" for report in reports.values()), {r: v[6] for r, v in reports.items()}
    # and each rank takes its own by local rank: cuda:0 and cuda:1 on each node
    assert all(report[7] == f"cuda:{report[5]}" for report in reports.values()), reports
    assert {node: sorted(gpus) for node, gpus in _gpus_taken(reports).items()} == {
        "n1": ["0", "1"],
        "n2": ["0", "1"],
    }


@pytest.mark.slurm
@pytest.mark.timeout(JOB_WITHIN_S + 120)
def test_a_failed_rank_restarts_both_nodes_and_they_resume_from_the_shared_checkpoint(cluster, tmp_path):
    checkpoints = tmp_path / "checkpoints"  # one filesystem: both "nodes" see it, as they must
    args = [
        "--steps",
        6,
        "--save-every",
        2,
        "--fail-at-step",
        3,
        "--fail-rank",
        1,
        "--log-every",
        1,
        "--num-samples",
        256,
        "--run-dir",
        tmp_path / "run",
    ]
    script = tmp_path / "sbatch.sh"
    script.write_text(
        slurm_script(
            str(REPO / "ddp_helpers/workers/train.py"),
            args,
            nnodes=2,
            nproc_per_node=1,
            gpus_per_node=0,
            cpus_per_rank=1,
            max_restarts=1,
            checkpoint_dir=str(checkpoints),
            rdzv_port=free_port(),
            venv=this_environment(),
        )
    )
    assert "--max-restarts 1" in script.read_text() and "--resume" in script.read_text()
    job_id = slurm.submit(script, chdir=tmp_path, log=tmp_path / "job.log")
    job = slurm.follow(job_id, tmp_path / "job.log", timeout_s=JOB_WITHIN_S, echo=False)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.lines[-40:]
    rank0 = job.rank_lines[0]
    assert any(line.startswith("no checkpoint in") for line in rank0), rank0  # first attempt: from scratch
    resumed = [line for line in rank0 if line.startswith("resumed from")]
    assert len(resumed) == 1 and " step 2," in resumed[0], rank0  # the last checkpoint before the fault
    assert rank0[-1].startswith("done: 6 steps"), rank0  # and the job went on to its end
    assert any("injected fault on rank 1 at step 3" in line for line in job.rank_lines[1]), job.rank_lines[1]


BREAKPOINT_WORKER = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.breakpoint(rank=0)  # pdb on rank 0, which opens /dev/stdin: under sbatch, no terminal
print("went on past the breakpoint")
"""


@pytest.mark.slurm
@pytest.mark.timeout(JOB_WITHIN_S + 120)
def test_dist_breakpoint_in_a_batch_job_has_no_terminal_and_quits(cluster, tmp_path):
    """Notebook 05: under sbatch, torch.distributed.breakpoint's pdb reads end-of-file at its first prompt
    and quits (BdbQuit): a batch job has no terminal to ask. salloc + srun --pty instead."""
    (tmp_path / "worker.py").write_text(BREAKPOINT_WORKER)
    script = tmp_path / "sbatch.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n"
        f"srun {sys.executable} -m torch.distributed.run --standalone --nproc-per-node 1 worker.py\n"
    )
    job_id = slurm.submit(script, chdir=tmp_path, log=tmp_path / "job.log")
    job = slurm.follow(job_id, tmp_path / "job.log", timeout_s=JOB_WITHIN_S, echo=False)
    text = "\n".join(job.lines)
    assert job.state == "FAILED" and "(Pdb)" in text and "bdb.BdbQuit" in text, text[-3000:]
    assert "went on past the breakpoint" not in text


def _metrics_lines(run_dir: Path) -> int:
    path = run_dir / "metrics" / "rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slurm
@pytest.mark.timeout(2 * JOB_WITHIN_S + 120)
def test_a_preempted_job_saves_requeues_itself_and_resumes_from_the_saved_step(cluster, tmp_path):
    """The notice SLURM sends before the time limit (--signal=B:USR1@...), sent now with scancel:
    every rank saves at the next logged step and stops, the job requeues itself, and when it starts
    again it resumes from that step, not from scratch, and runs to its end."""
    steps = 40
    args = ["--steps", steps, "--log-every", 1, "--save-every", 1000, "--num-samples", 256]
    args += ["--straggler", "0:150", "--run-dir", tmp_path / "run"]  # rank 0 slows every step: time to signal
    script = tmp_path / "sbatch.sh"
    script.write_text(
        slurm_script(
            str(REPO / "ddp_helpers/workers/train.py"),
            args,
            nnodes=2,
            nproc_per_node=1,
            gpus_per_node=0,
            cpus_per_rank=1,
            checkpoint_dir=str(tmp_path / "checkpoints"),
            time_limit="00:10:00",
            venv=this_environment(),
        )
    )
    job_id = slurm.submit(script, chdir=tmp_path, log=tmp_path / "job.log")
    deadline = time.monotonic() + JOB_WITHIN_S
    while _metrics_lines(tmp_path / "run") < 3:  # a few steps taken: mid-run
        assert slurm.in_queue(job_id) and time.monotonic() < deadline, (tmp_path / "job.log").read_text()
        time.sleep(0.2)
    notice = subprocess.run(
        ["scancel", "--batch", "--signal=USR1", str(job_id)], capture_output=True, text=True, timeout=15
    )
    assert notice.returncode == 0, notice.stderr
    job = slurm.follow(job_id, tmp_path / "job.log", timeout_s=JOB_WITHIN_S, echo=False)
    assert (job.state, job.exit_code, job.facts.get("Restarts")) == ("COMPLETED", "0:0", "1"), job.lines[-40:]
    starts = [line for line in job.lines if line.startswith(f"job {job_id} starts")]
    assert [s.split(" on ")[0] for s in starts] == [f"job {job_id} starts (restart {n})" for n in (0, 1)], (
        job.lines
    )
    assert any(line.startswith("preemption notice") for line in job.lines), job.lines
    rank0 = job.rank_lines[0]
    stopped = [re.search(r"checkpoint saved at step (\d+); stopping", line) for line in rank0]
    (saved,) = [int(m[1]) for m in stopped if m]
    assert 3 <= saved < steps, rank0
    resumed = [line for line in rank0 if line.startswith("resumed from")]
    assert len(resumed) == 1 and f": step {saved}," in resumed[0], rank0  # from the step saved at the notice
    assert rank0.index(resumed[0]) > rank0.index(next(line for line in rank0 if "stopping" in line))
    assert rank0[-1].startswith(f"done: {steps} steps"), rank0  # and on to the end


@pytest.mark.slurm
@pytest.mark.timeout(JOB_WITHIN_S + 120)
def test_a_job_past_its_bound_is_cancelled(cluster, tmp_path):
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\necho started\nsleep 120\n")
    job_id = slurm.submit(script, chdir=tmp_path, log=tmp_path / "sleep.log")
    with pytest.raises(slurm.SlurmTimeout, match=f"job {job_id} did not end within 3 s: cancelled"):
        slurm.follow(job_id, tmp_path / "sleep.log", timeout_s=3)
    deadline = time.monotonic() + 30
    while slurm.in_queue(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm.job_facts(job_id)["JobState"] == "CANCELLED"
