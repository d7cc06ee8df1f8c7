"""The generated cluster files: parsed, checked line by line, and their torchrun commands run here.

Here each test plays the scheduler's part in the smallest way: for SLURM, `srun` runs its command
once (one node; tests/chapters/ch06_scaling_out/test_slurm.py submits the file to a real SLURM);
test_trainjob.py does the same for the Kubernetes file. torchrun and the worker are real.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddp_helpers.chapters.ch06_scaling_out.ch06_cluster_templates import (
    slurm_script,
    srun_script,
    this_environment,
    write_cluster_templates,
)
from ddp_helpers.kernel.launcher.machine import free_port

REPO = Path(__file__).resolve().parents[3]
TRAIN = "ddp_helpers/workers/train.py"

# every rank adds rank + 1 and writes what it got, so the test sees that the world formed
WORKER = """\
import json, os, sys
import torch
import torch.distributed as dist
from ddp_helpers.rank import teardown

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ["DDP_RUN_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": total.item(), "threads": os.environ.get("OMP_NUM_THREADS")}, f)
teardown.destroy_process_group()
"""


def _reports(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# SLURM's client, as much of it as the job scripts use: node lists such as node[07-08] expanded, node07's
# NodeAddr 127.0.0.7 (a loopback address of its own, so a test sees which node was asked); anything
# else (requeue) logged
FAKE_SCONTROL = """\
import os, re, sys

args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    m = re.fullmatch(r"(\\w+)\\[(\\d+)-(\\d+)\\]", args[2])
    width = len(m[2]) if m else 0
    print(*([f"{m[1]}{i:0{width}d}" for i in range(int(m[2]), int(m[3]) + 1)] if m else args[2].split(",")), sep="\\n")
elif args[:2] == ["show", "node"]:
    addr = "127.0.0." + str(int(re.search(r"\\d+$", args[2])[0]))
    print(f"NodeName={args[2]} Arch=x86_64 CoresPerSocket=1\\n   NodeAddr={addr} NodeHostName={args[2]}")
else:
    with open(os.environ["SCONTROL_LOG"], "a") as log:
        print("scontrol", *args, file=log)
"""


def _fake_slurm_bin(folder: Path) -> Path:
    """srun that runs its command once (one task, one node); scontrol as above; scancel that logs."""
    folder.mkdir(exist_ok=True)
    _executable(folder / "srun", '#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\nexec "$@"\n')
    _executable(folder / "scontrol", f"#!{sys.executable}\n{FAKE_SCONTROL}")
    _executable(folder / "scancel", '#!/bin/bash\necho "scancel $*" >> "$SCONTROL_LOG"\n')
    return folder


def _job_env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a batch script: SLURM's variables, and no torch on PATH unless the script
    activates it (where the tests run in a virtual environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "VIRTUAL_ENV")}
    path = [p for p in env["PATH"].split(os.pathsep) if Path(p) != Path(sys.executable).parent]
    if this_environment() is None:  # a system python: the script activates nothing, torchrun is on PATH
        path.insert(0, str(Path(sys.executable).parent))
    env.update(
        PATH=os.pathsep.join([str(bin_dir), *path]),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="node[07-08]",
        SLURM_CPUS_PER_TASK="2",
        SCONTROL_LOG=str(tmp_path / "scontrol.log"),
        TMPDIR=str(tmp_path),  # torchrun without --log-dir makes a torchelastic_* folder there, and keeps it
    )
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------ SLURM
def test_slurm_script_asks_for_the_cores_of_every_rank_and_passes_them_to_srun(tmp_path):
    text = slurm_script(TRAIN, ["--epochs", 1], nnodes=2, nproc_per_node=8, cpus_per_rank=6, partition="gpu")
    (tmp_path / "job.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0  # valid shell
    directives = [line.split("#")[1].strip() for line in text.splitlines() if line.startswith("#SBATCH")]
    for needed in (
        "SBATCH --nodes=2",
        "SBATCH --ntasks-per-node=1",
        "SBATCH --cpus-per-task=48",
        "SBATCH --gpus-per-node=8",
        "SBATCH --partition=gpu",
    ):
        assert needed in directives, (needed, directives)
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-6}"' in text
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert srun.startswith(
        'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 3 --tee 3'
    )
    assert "MASTER_ADDR=" not in text  # with c10d torchrun sets it for its workers: an export does nothing
    assert '--rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head_addr:$rdzv_port"' in srun
    assert srun.endswith(f"{TRAIN} --epochs 1")
    assert (REPO / TRAIN).is_file()  # the path the notebook passes is the repository's worker


def test_slurm_script_on_cpus_requests_no_gpu():
    text = slurm_script("w.py", nnodes=1, nproc_per_node=3, gpus_per_node=0, cpus_per_rank=2)
    assert "--gpus-per-node" not in text.replace("# (no GPUs requested", "")
    assert "#SBATCH --cpus-per-task=6 " in text


@pytest.mark.parametrize("bad", [{"nnodes": 0}, {"nproc_per_node": 0}, {"cpus_per_rank": 0}])
def test_slurm_script_refuses_impossible_shapes(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        slurm_script("w.py", **bad)


def test_generated_sbatch_script_runs_its_torchrun_on_one_cpu_node(tmp_path):
    """The script itself, run by bash with stand-ins for srun and scontrol: it activates the
    environment (torchrun is on no other PATH here), and torchrun forms the world."""
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    job = tmp_path / "sbatch.sh"
    job.write_text(
        slurm_script(
            "worker.py",
            ["--out", out],
            nnodes=1,
            nproc_per_node=2,
            gpus_per_node=0,
            cpus_per_rank=1,
            rdzv_port=free_port(),
            venv=this_environment(),
        )
    )
    env = _job_env(tmp_path, _fake_slurm_bin(tmp_path / "bin"))
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(out)
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3 and r["threads"] == "1" for r in reports)


def test_slurm_script_elastic_with_restarts_and_a_shared_checkpoint_folder(tmp_path):
    text = slurm_script(
        TRAIN, ["--epochs", 1], nnodes=4, min_nodes=2, max_restarts=5, checkpoint_dir="/shared/ckpt"
    )
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert "--nnodes 2:4" in srun and "--max-restarts 5" in srun
    assert srun.endswith(f"{TRAIN} --epochs 1 --checkpoint-dir /shared/ckpt --resume --save-on-sigterm &")
    assert "on a filesystem every node sees" in text and "mkdir -p /shared/ckpt" in text
    with pytest.raises(ValueError, match="min_nodes must be between 1 and nnodes"):
        slurm_script(TRAIN, nnodes=2, min_nodes=3)


def _with_last_lines(text: str, count: int, replacement: str) -> str:
    """The script with its last `count` lines (its srun command) replaced."""
    return "\n".join([*text.rstrip("\n").splitlines()[:-count], replacement, ""])


@pytest.mark.parametrize("job_id", ["123456", "7"])
def test_slurm_scripts_meet_on_the_first_node_of_the_list_at_a_port_of_the_job(tmp_path, job_id):
    """The rendezvous (torchrun's, or MASTER_ADDR:MASTER_PORT without it) is on the allocation's first
    node, wherever the batch script runs, at a port derived from the job id: two jobs on one node
    must not both take 29500. The ports lie below Linux's ephemeral range (32768-60999)."""
    bin_dir = _fake_slurm_bin(tmp_path / "bin")
    env = _job_env(tmp_path, bin_dir, SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="gpu[07-09]")
    port = 20000 + int(job_id) % 10000
    torchrun_job = _with_last_lines(slurm_script("w.py", venv=None), 1, 'echo "$head_addr:$rdzv_port"')
    srun_job = _with_last_lines(srun_script("w.py", venv=None), 3, 'echo "$MASTER_ADDR:$MASTER_PORT"')
    for script in (torchrun_job, srun_job):
        proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert (proc.returncode, proc.stdout) == (0, f"127.0.0.7:{port}\n"), (proc.stderr, script)
    assert 20000 <= port < 32768
    code = [line for line in (slurm_script("w.py") + srun_script("w.py")).splitlines() if line[:1] != "#"]
    assert not [line for line in code if "29500" in line]


def test_slurm_scripts_activate_the_environment_first():
    for make in (slurm_script, srun_script):
        lines = make("w.py", venv="/opt/envs/ddp").splitlines()
        activate = lines.index("source /opt/envs/ddp/bin/activate")
        assert activate < next(i for i, line in enumerate(lines) if line.startswith("srun "))
        assert not any(line.startswith("source ") for line in make("w.py", venv=None).splitlines())
    assert "source .venv/bin/activate" in slurm_script("w.py")  # the repository's, by default


def test_srun_script_shows_every_task_its_nodes_gpus_and_gives_the_rank_its_identity():
    """Every task of a node sees all the node's GPUs and takes cuda:LOCAL_RANK; no per-task binding
    (--gpus-per-task, where SLURM confines each task's GPU in a cgroup, cost NCCL its NVLink: nccl#1066)."""
    text = srun_script(TRAIN, ["--epochs", 1], nnodes=2, nproc_per_node=4, cpus_per_rank=3)
    directives = [line.split("#")[1].strip() for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives[1:5] == [
        "SBATCH --nodes=2",
        "SBATCH --ntasks-per-node=4",
        "SBATCH --gpus-per-node=4",
        "SBATCH --cpus-per-task=3",
    ]
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    # nothing binds a task to one GPU: neither --gpus-per-task nor a --gpu-bind (map_gpu, single, ...)
    assert not [line for line in code if "--gpus-per-task" in line or "--gpu-bind" in line]
    assert "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS;" in text
    assert text.rstrip().endswith(f"rank {TRAIN} --epochs 1") and "torchrun --" not in text
    cpu = srun_script("w.py", gpus_per_node=0)
    assert "--gpus-per-node" not in cpu and "--gpu-bind" not in cpu
    with pytest.raises(ValueError, match="4 ranks per node need 4 GPUs per node"):
        srun_script("w.py", nproc_per_node=4, gpus_per_node=2)


def test_written_srun_file_takes_the_notebooks_gpus_per_node(tmp_path):
    paths = write_cluster_templates(tmp_path, "w.py", nnodes=2, nproc_per_node=2, gpus_per_node=8)
    assert "#SBATCH --gpus-per-node=8 " in paths["srun"].read_text()
    paths = write_cluster_templates(tmp_path, "w.py", nnodes=2, nproc_per_node=2, gpus_per_node=0)
    assert "--gpus-per" not in paths["srun"].read_text()


def _fake_step(folder: Path) -> Path:
    """srun as a job step that runs until SIGTERM, then says so; scancel that signals it, as SLURM would."""
    _fake_slurm_bin(folder)
    _executable(
        folder / "srun",
        "#!/bin/bash\n"
        'echo $$ > "$SCONTROL_LOG.step"\n'
        'trap \'echo "step: SIGTERM, saved, stopping" >> "$SCONTROL_LOG"; kill %1; exit 0\' TERM\n'
        'sleep "${STEP_S:-30}" & wait $!\n'
        'exit "${STEP_EXIT:-0}"\n',
    )
    _executable(
        folder / "scancel",
        '#!/bin/bash\necho "scancel $*" >> "$SCONTROL_LOG"\nkill -TERM "$(cat "$SCONTROL_LOG.step")"\n',
    )
    return folder


def test_sbatch_script_on_a_preemption_notice_stops_every_step_and_requeues_itself(tmp_path):
    """USR1 to the batch script (--signal=B:USR1): SIGTERM to the steps, their end awaited, then a requeue."""
    text = slurm_script(TRAIN, nnodes=2, nproc_per_node=2, checkpoint_dir="/shared/ckpt", venv=None)
    for directive in ("--signal=B:USR1@120", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {directive} " in text, directive
    assert "--checkpoint-dir /shared/ckpt --resume --save-on-sigterm &" in text
    log = tmp_path / "scontrol.log"
    env = _job_env(tmp_path, _fake_step(tmp_path / "bin"))
    job = subprocess.Popen(["bash", "-c", text], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not Path(f"{log}.step").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the script reaches its `wait`
        job.send_signal(signal.SIGUSR1)
        out, _ = job.communicate(timeout=20)
    finally:
        job.kill()
    assert job.returncode == 0, out
    assert "preemption notice: job 4242 saves a checkpoint and requeues" in out
    assert log.read_text().splitlines() == [
        "scancel --signal=TERM 4242",
        "step: SIGTERM, saved, stopping",
        "scontrol requeue 4242",
    ]


def test_sbatch_script_without_a_notice_ends_as_its_step_did_and_stays_out_of_the_queue(tmp_path):
    text = slurm_script(TRAIN, checkpoint_dir="/shared/ckpt", venv=None)
    env = _job_env(tmp_path, _fake_step(tmp_path / "bin"), STEP_S="0", STEP_EXIT="3")
    proc = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3 and not (tmp_path / "scontrol.log").exists(), proc.stdout
    plain = slurm_script(TRAIN, venv=None)  # no checkpoint folder: nothing to save, no requeue
    assert "--signal" not in plain and "--requeue" not in plain and "--save-on-sigterm" not in plain


def test_write_cluster_templates_refuses_an_unknown_option(tmp_path):
    paths = write_cluster_templates(tmp_path, TRAIN, nnodes=2, nproc_per_node=2, image="x", cpus_per_rank=2)
    assert "#SBATCH --cpus-per-task=4 " in paths["slurm"].read_text()
    (job,) = [doc for doc in yaml.safe_load_all(paths["kubernetes"].read_text()) if doc["kind"] == "TrainJob"]
    assert job["spec"]["trainer"]["numProcPerNode"] == 2
    assert "#SBATCH --ntasks-per-node=2 " in paths["srun"].read_text()
    with pytest.raises(TypeError, match="unknown options: gpus"):
        write_cluster_templates(tmp_path, TRAIN, gpus=2)


def test_slurm_scripts_send_every_nodes_flight_recorder_dumps_to_one_shared_folder(tmp_path):
    """By default each rank dumps on its own node (~/.cache/torch on torch 2.14, /tmp/nccl_trace_rank_ on
    2.7); the analyser reads one folder. The job files point torch 2.14's and 2.7's variable at one folder
    under the submit dir, and create it."""
    bin_dir = _fake_slurm_bin(tmp_path / "bin")
    submit = tmp_path / "submitted-here"
    submit.mkdir()
    env = _job_env(tmp_path, bin_dir, SLURM_SUBMIT_DIR=str(submit))
    show = 'echo "$TORCH_FR_DUMP_TEMP_FILE $TORCH_NCCL_DEBUG_INFO_TEMP_FILE"'
    jobs = [
        _with_last_lines(slurm_script("w.py", venv=None), 1, show),
        _with_last_lines(srun_script("w.py", venv=None), 3, show),
    ]
    prefix = submit / "flight-recorder" / "4242" / "nccl_trace_rank_"
    for script in jobs:
        proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert (proc.returncode, proc.stdout.split()) == (0, [str(prefix)] * 2), (proc.stderr, script)
    assert prefix.parent.is_dir()  # the writer opens the file; it makes no folder
