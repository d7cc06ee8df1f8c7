"""Job files for real clusters (sbatch with torchrun, srun alone, a Kubeflow TrainJob), from a notebook's worker.

Every torchrun file passes --max-restarts and, with a checkpoint folder every node sees, --resume.
"""

from __future__ import annotations

import inspect
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddp_helpers.chapters.ch06_scaling_out.ch06_trainjob import (
    CPUS_PER_RANK,
    FRESH_STORE_LINES,
    LOG_LINE_PREFIX,
    MAX_RESTARTS,
    check_job_shape,
    trainjob_manifest,
    worker_args_for,
)

# the job's own rendezvous port: a fixed 29500 collides when two jobs share a node; 20000-29999 lies below
# Linux's ephemeral ports, so no outgoing connection holds it
JOB_PORT = "$((20000 + SLURM_JOB_ID % 10000))"
# the allocation's first node and its NodeAddr, for the store every node connects to. awk, not head -n1:
# under pipefail a scontrol still writing a long list would die of SIGPIPE, and the script with it
HEAD_NODE_LINES = [
    "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | awk 'NR == 1')  # the first node",
    'head_addr=$(scontrol show node "$head_node" | grep -o \'NodeAddr=[^ ]*\' | cut -d= -f2 || echo "$head_node")',
]
# Flight Recorder's dumps in one folder every node sees (by default each node's own: DebugInfoWriter in
# c10d/FlightRecorder.cpp); torch 2.14 reads TORCH_FR_DUMP_TEMP_FILE, 2.7 only the old name
FLIGHT_RECORDER_LINES = [
    "# Flight Recorder dumps (NCCL watchdog timeouts) from every node in one folder, for torchfrtrace:",
    "# the default is each node's own ~/.cache/torch (torch 2.14) or /tmp/nccl_trace_rank_<rank> (torch 2.7)",
    'fr_dir="${SLURM_SUBMIT_DIR:-$PWD}/flight-recorder/$SLURM_JOB_ID"',
    'mkdir -p "$fr_dir"',
    'export TORCH_FR_DUMP_TEMP_FILE="$fr_dir/nccl_trace_rank_"  # torch 2.14',
    'export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$fr_dir/nccl_trace_rank_"  # torch 2.7 (2.14 reads it too)',
]
PREEMPT_NOTICE_S = 120  # USR1 this long before the time limit: enough for a save at the next logged step


def this_environment() -> str | None:
    """The virtual environment this Python runs in, or None for a system Python (the container's image)."""
    return sys.prefix if sys.prefix != sys.base_prefix else None


def _torchrun_command(
    worker: str, args: list[str], nnodes: str, nproc_per_node: int, max_restarts: int
) -> str:
    """One torchrun agent's command line, at the job's c10d rendezvous on the first node."""
    options = {
        "--nnodes": nnodes,
        "--nproc-per-node": nproc_per_node,
        "--max-restarts": max_restarts,
        "--tee": 3,
        "--rdzv-backend": "c10d",
        "--rdzv-id": "RDZV_ID",  # shell variables, quoted below: shlex would quote their $ away
        "--rdzv-endpoint": "ENDPOINT",
    }
    flags = [str(item) for pair in options.items() for item in pair]
    command = shlex.join(["torchrun", *flags, worker, *args])
    return command.replace("RDZV_ID", '"$SLURM_JOB_ID"').replace("ENDPOINT", '"$head_addr:$rdzv_port"')


def _script_head(
    job_name: str, nnodes: int, resources: list[str], time_limit: str, partition: str | None, venv: str | None
) -> list[str]:
    """An sbatch script's directives (`resources`: tasks, cores, GPUs), then strict mode and the job's python."""
    activate = ["# (no environment to activate: torch and ddp_helpers are installed for the system's python)"]
    if venv is not None:
        activate = [
            "# the job's python: the environment with torch and ddp_helpers, in a folder every node sees",
            f"source {shlex.quote(os.path.join(venv, 'bin', 'activate'))}",
        ]
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        *resources,
        f"#SBATCH --time={time_limit}",
        *([f"#SBATCH --partition={partition}"] if partition else []),
        "set -euo pipefail",
        "",
        *activate,
    ]


NO_GPU_LINE = "# (no GPUs requested: gloo on CPUs)"


def slurm_script(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    min_nodes: int | None = None,
    max_restarts: int = MAX_RESTARTS,
    checkpoint_dir: str | None = None,
    job_name: str = "ddp",
    time_limit: str = "01:00:00",
    partition: str | None = None,
    rdzv_port: int | None = None,
    venv: str | None = ".venv",
) -> str:
    """An sbatch script that runs `worker` with torchrun on `nnodes` nodes."""
    check_job_shape(nnodes, nproc_per_node, cpus_per_rank, min_nodes)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    cpus = nproc_per_node * cpus_per_rank
    preemptible = checkpoint_dir is not None
    resources = [
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the processes",
        f"#SBATCH --cpus-per-task={cpus}           # {nproc_per_node} ranks x {cpus_per_rank} cores, all in the agent's task",
        f"#SBATCH --gpus-per-node={gpus}" if gpus else NO_GPU_LINE,
        *(PREEMPTIBLE_DIRECTIVES if preemptible else []),
    ]
    lines = [
        *_script_head(job_name, nnodes, resources, time_limit, partition, venv),
        "# the rendezvous store runs on the allocation's first node, at a port of this job's own: a fixed",
        "# one (29500) collides when two jobs share a node. (no MASTER_ADDR: with c10d, torchrun reads",
        "# --rdzv-endpoint and sets MASTER_ADDR for its workers)",
        *HEAD_NODE_LINES,
        f"rdzv_port={JOB_PORT if rdzv_port is None else rdzv_port}",
        "# torchrun would give each rank 1 thread; give it its share of the task's cores",
        f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{cpus_per_rank}}}"',
        "# --tee 3 copies every rank's stdout and stderr here, each line prefixed with its global rank",
        f"export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='{LOG_LINE_PREFIX}'",
        *(FRESH_STORE_LINES if max_restarts > 0 else []),
        *FLIGHT_RECORDER_LINES,
        "# export NCCL_SOCKET_IFNAME=ib0   # the interface NCCL should use, if the default is wrong",
        "# export NCCL_DEBUG=INFO          # print the transport NCCL picked (IB, sockets) at start",
    ]
    if checkpoint_dir is not None:
        lines += [
            "# the checkpoints must be on a filesystem every node sees: after a restart, rank 0 may be elsewhere",
            f"mkdir -p {shlex.quote(checkpoint_dir)}",
        ]
    args = worker_args_for(worker_args, checkpoint_dir, save_on_sigterm=preemptible)
    # torchrun's --nnodes: N for a fixed world, MIN:MAX for an elastic one
    nodes = str(nnodes) if min_nodes is None or min_nodes == nnodes else f"{min_nodes}:{nnodes}"
    command = _torchrun_command(worker, args, nodes, nproc_per_node, max_restarts)
    srun = [
        "# srun does not inherit --cpus-per-task from sbatch (SLURM >= 22.05): pass it on",
        f'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" {command}',
    ]
    lines += ["", *(_preemption_lines(srun) if preemptible else srun), ""]
    return "\n".join(lines)


# the job may go back to the queue; USR1 tells this script (B:) that its end is near
PREEMPTIBLE_DIRECTIVES = [
    f"#SBATCH --signal=B:USR1@{PREEMPT_NOTICE_S}      # USR1 to this script {PREEMPT_NOTICE_S} s before the time limit",
    "#SBATCH --requeue                    # a preempted or requeued job starts again, and resumes",
    "#SBATCH --open-mode=append           # each start appends to the log, not over the last one's",
]


def _preemption_lines(srun: list[str]) -> list[str]:
    """srun in the background, and a trap that saves and requeues on USR1."""
    return [
        "# a preemption notice (USR1): every rank saves a checkpoint and stops, then the job goes back",
        "# to the queue and resumes from that checkpoint when it starts again",
        "preempted=0",
        "on_notice() {",
        "    preempted=1",
        '    echo "preemption notice: job $SLURM_JOB_ID saves a checkpoint and requeues"',
        '    scancel --signal=TERM "$SLURM_JOB_ID"  # every step (torchrun and its workers), not this script',
        "}",
        "trap on_notice USR1",
        'echo "job $SLURM_JOB_ID starts (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"',
        *srun[:-1],
        "# in the background: bash runs a trap only between commands, and `wait` returns at a signal",
        f"{srun[-1]} &",
        "srun_pid=$!",
        'status=0; wait "$srun_pid" || status=$?',
        'if [ "$preempted" = 1 ]; then',
        '    wait "$srun_pid" || true  # until every rank has saved and stopped',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "fi",
        'exit "$status"',
    ]


def srun_script(
    worker: str,
    worker_args: Sequence[object] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 8,
    gpus_per_node: int | None = None,
    cpus_per_rank: int = CPUS_PER_RANK,
    job_name: str = "ddp",
    time_limit: str = "01:00:00",
    partition: str | None = None,
    venv: str | None = ".venv",
) -> str:
    """An sbatch script that starts every rank with `srun`, without torchrun: one task per rank."""
    check_job_shape(nnodes, nproc_per_node, cpus_per_rank)
    gpus = nproc_per_node if gpus_per_node is None else gpus_per_node
    if 0 < gpus < nproc_per_node:
        raise ValueError(
            f"{nproc_per_node} ranks per node need {nproc_per_node} GPUs per node (one each, cuda:LOCAL_RANK); "
            f"got gpus_per_node={gpus}"
        )
    resources = [
        f"#SBATCH --ntasks-per-node={nproc_per_node}          # one task per rank: srun starts the ranks, no torchrun",
        f"#SBATCH --gpus-per-node={gpus}             # all the node's GPUs, seen by every task of the node"
        if gpus
        else NO_GPU_LINE,
        f"#SBATCH --cpus-per-task={cpus_per_rank}",
    ]
    lines = [
        *_script_head(job_name, nnodes, resources, time_limit, partition, venv),
        "# no agent sets these here: the first node hosts the store, at a port of this job's own",
        *HEAD_NODE_LINES,
        'export MASTER_ADDR="$head_addr"',
        f"export MASTER_PORT={JOB_PORT}",
        f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{cpus_per_rank}}}"',
        *FLIGHT_RECORDER_LINES,
        "",
        "# each task is one rank: SLURM numbers the tasks, init_process_group reads torchrun's names (env://)",
        *(SRUN_GPU_LINES if gpus else []),
        'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" bash -c \\',
        "    'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS; exec python -u \"$@\"' \\",
        f"    rank {shlex.join([worker, *map(str, worker_args)])}",
        "",
    ]
    return "\n".join(lines)


SRUN_GPU_LINES = [
    "# every task sees all the node's GPUs and takes cuda:LOCAL_RANK; not --gpus-per-task=1: where SLURM",
    "# confines each task's GPU in a cgroup of its own, NCCL loses NVLink within a node (nccl#1066)",
]


def _options(job_file: Callable[..., str]) -> set[str]:
    """The options a job file's function takes: its keyword-only parameters."""
    return {n for n, p in inspect.signature(job_file).parameters.items() if p.kind is p.KEYWORD_ONLY}


def write_cluster_templates(
    directory: str | os.PathLike[str], worker: str, worker_args: Sequence[object] = (), **options: Any
) -> dict[str, Path]:
    """Write ``sbatch.sh``, ``srun.sh`` and ``trainjob.yaml`` into `directory` (keys ``slurm``, ``srun``, ``kubernetes``)."""
    files: dict[str, tuple[str, Callable[..., str]]] = {
        "slurm": ("sbatch.sh", slurm_script),
        "srun": ("srun.sh", srun_script),
        "kubernetes": ("trainjob.yaml", trainjob_manifest),
    }
    unknown = set(options).difference(*(_options(write) for _, write in files.values()))
    if unknown:
        raise TypeError(f"unknown options: {', '.join(sorted(unknown))}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, (name, write) in files.items():
        paths[key] = folder / name
        text = write(worker, worker_args, **{k: v for k, v in options.items() if k in _options(write)})
        if key == "kubernetes" and options.get("min_nodes") is not None:
            text = (
                f"# min_nodes={options['min_nodes']} is not here: Kubeflow Trainer v2 runs a fixed numNodes (no "
                "elastic\n# range); sbatch.sh has it (torchrun --nnodes MIN:MAX).\n" + text
            )
        paths[key].write_text(text)
    return paths
