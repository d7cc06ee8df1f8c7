"""Notebook 06: init (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.chapters.ch06_scaling_out.ch06_shared import (
    CPU_PER_NODE,
    GPUS_PER_NODE,
    NODES,
    _Recorder,
    _stand_ins,
    cpu_rank,
    gpu_ranks,
    pretend_env,
)
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen


# ------------------------------------------------------------------ 06-init
def _init_setup(ctx: Context) -> dict[str, Any]:
    return _stand_ins()


def _probes(live_rank: int) -> list[tuple[int, int, int]]:
    """(rank, processes per node, GPUs per node) of each pretend process a live rank probes."""
    return [(r, GPUS_PER_NODE, GPUS_PER_NODE) for r in gpu_ranks(live_rank)] + [
        (cpu_rank(live_rank), CPU_PER_NODE, 0)
    ]


def _describe(rank: int, per_node: int, gpus: int) -> str:
    """A probe, in a few words: the call, with the pretend process it stands for (the field name of its
    outcome; the verdict puts the live rank that made the call before it)."""
    where = f"{gpus} GPUs" if gpus else "no GPU"
    node = f"node {rank // per_node}, LOCAL_RANK {rank % per_node}, {where}"
    return f"init_distributed(env of RANK {rank} of {NODES * per_node}: {node})"


def _outcome(row: dict[str, Any]) -> str:
    """A probe's outcome in one short line: the calls it made, then what it returned or raised (the
    order of init_process_group and set_device is not checked: either may come first)."""
    calls = [f"init_process_group({b})" for b in row["backend"]] + [
        f"set_device({i})" for i in row["set_device"]
    ]
    end = f"raised {row['error']}" if row["error"] else f"-> {row['device']}, shard {tuple(row['shard'])}"
    return ", ".join(calls or ["no call"]) + " " + end


def _init_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    function: Any = ns.get("init_distributed")  # None where the answer defined none: the call raises
    out: dict[str, Any] = {"_probes": []}  # "_probes": for the signatures, not compared
    from ddp_helpers.rank.spec import environment

    for rank, per_node, gpus in _probes(ctx.rank):
        recorder = _Recorder(gpus)
        recorder.env = dict(pretend_env(rank, per_node))  # what the pretend group reads at init
        ns["_record"].current = recorder
        row: dict[str, Any] = {"error": None, "device": None, "shard": None}
        try:  # os.environ too is the pretend process's: an answer may read it, as a script does
            with environment(pretend_env(rank, per_node)):
                device, shard = function(dict(pretend_env(rank, per_node)))
            row["device"], row["shard"] = str(device), [int(v) for v in shard]
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"
        row["backend"], row["set_device"] = recorder.backends, recorder.set_device
        out["_probes"].append(row)
        out[_describe(rank, per_node, gpus)] = _outcome(row)
    return out


def _init_expected(world: int) -> Seen:
    rows = []
    for live in range(world):
        row: dict[str, Any] = {}
        for rank, per_node, gpus in _probes(live):
            local = rank % per_node
            right = {
                "backend": ["nccl" if gpus else "gloo"],
                "set_device": [local] if gpus else [],
                "device": f"cuda:{local}" if gpus else "cpu",  # LOCAL_RANK: the GPU on this node
                "shard": [rank, NODES * per_node],  # RANK of WORLD_SIZE: a shard of the whole world
                "error": None,
            }
            row[_describe(rank, per_node, gpus)] = _outcome(right)
        rows.append(row)
    return rows


def _probed(seen: Seen) -> list[tuple[int, int, int, dict[str, Any]]]:
    """(RANK, LOCAL_RANK, GPUs, what the call did) of every probe of every live rank."""
    out = []
    for live, s in enumerate(seen):
        for (rank, per_node, gpus), got in zip(_probes(live), s.get("_probes") or [], strict=False):
            out.append((rank, rank % per_node, gpus, got))
    return out


def _device_from_rank(seen: Seen, expected: Seen) -> bool:
    return any(
        gpus and rank != local and (rank in got["set_device"] or got["device"] == f"cuda:{rank}")
        for rank, local, gpus, got in _probed(seen)
    )


def _no_set_device(seen: Seen, expected: Seen) -> bool:
    on_gpus = [(local, got) for rank, local, gpus, got in _probed(seen) if gpus]
    return bool(on_gpus) and all(
        not got["set_device"] and got["device"] == f"cuda:{local}" for local, got in on_gpus
    )


def _shard_from_local(seen: Seen, expected: Seen) -> bool:
    return any(
        rank != local and isinstance(got["shard"], list) and got["shard"][:1] == [local]
        for rank, local, gpus, got in _probed(seen)
    )


def _backend_where(on_gpus: bool, wrong: str) -> Callable[[Seen, Seen], bool]:
    def matches(seen: Seen, expected: Seen) -> bool:
        return any(got["backend"] == [wrong] for _, _, gpus, got in _probed(seen) if bool(gpus) == on_gpus)

    return matches


INIT = Exercise(
    id="06-init",
    notebook="06",
    title="Start a rank of a multi-node job",
    task=(
        "Write `init_distributed(env)`, a rank's start-up, which reads torchrun's variables from `env` (in a "
        "script: `os.environ`). With GPUs: the device is this node's GPU `LOCAL_RANK`, made the current one "
        "with `torch.cuda.set_device`, and the backend is nccl; without: the CPU and gloo. Start the process "
        "group, and return `(device, (shard_rank, num_shards))`, the `rank=` and `num_replicas=` of this "
        "rank's `DistributedSampler`. The checker calls it as ranks of 2 nodes x 4 GPUs, and of 2 nodes "
        "x 2 CPU processes: here `torch.cuda` reports the pretend node's GPUs, and `dist` records the calls."
    ),
    given=(
        "`torch` (whose `torch.cuda` is the pretend node's), `dist` (its `init_process_group` is recorded, "
        "not run); `rank`, `world_size` and `local_rank` are None here: read `env`"
    ),
    starter=(
        "def init_distributed(env):\n"
        "    device = ...  # TODO: the node's GPU for this process, or the CPU\n"
        "    # TODO: on GPUs, make that GPU the current device\n"
        "    dist.init_process_group(...)  # TODO: the backend\n"
        "    return device, (..., ...)  # TODO: this rank's shard, and how many shards\n"
    ),
    reference=(
        "def init_distributed(env):\n"
        '    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])  # across every node\n'
        '    local_rank = int(env["LOCAL_RANK"])  # this process on its node: 0 .. LOCAL_WORLD_SIZE - 1\n'
        "    if torch.cuda.is_available():\n"
        '        device = torch.device("cuda", local_rank)  # the node GPU of this process, never RANK\n'
        "        torch.cuda.set_device(device)  # before any CUDA work, which would land on cuda:0\n"
        "    else:\n"
        '        device = torch.device("cpu")\n'
        '    backend = "nccl" if device.type == "cuda" else "gloo"\n'
        "    dist.init_process_group(backend)  # nccl for GPU tensors, gloo for CPU ones\n"
        "    return device, (rank, world_size)  # the shard: the job-wide rank, of the whole world\n"
    ),
    hint=(
        "RANK counts the processes of every node, LOCAL_RANK those of one node: a node's GPUs are numbered "
        "from 0 on each node, and the data is dealt over the whole world. nccl moves GPU tensors, gloo CPU ones."
    ),
    setup=_init_setup,
    observe=_init_observe,
    expected=_init_expected,
    mistakes=(
        Mistake(
            "06-init-device-from-rank",
            "a rank of node 1 asked for cuda:RANK (cuda:5 on a node of 4 GPUs): RANK counts the processes of "
            "every node. A node's GPUs are numbered from 0 on each node: the device is cuda:LOCAL_RANK",
            _device_from_rank,
            hint='Take the GPU from LOCAL_RANK, int(env["LOCAL_RANK"]), this process\'s place on its own node '
            "(0 to LOCAL_WORLD_SIZE - 1); RANK is for the shard.",
        ),
        Mistake(
            "06-init-shard-from-local-rank",
            "a rank of node 1 took the shard of its LOCAL_RANK: ranks 1 and 5 train on the same samples, and "
            "the shards of node 1's ranks are never seen. Deal the data by RANK over WORLD_SIZE",
            _shard_from_local,
            hint='Return (int(env["RANK"]), int(env["WORLD_SIZE"])) as the shard: this process\'s place in the '
            "whole job, of every node's processes. LOCAL_RANK picks the GPU only.",
        ),
        Mistake(
            "06-init-no-set-device",
            "the device is right, but torch.cuda.set_device was never called: every CUDA call that names no "
            "index (.cuda(), device='cuda') then lands on cuda:0, and every rank "
            "of the node crowds GPU 0",
            _no_set_device,
            hint="Call torch.cuda.set_device(device) as soon as the device is chosen, on GPUs only, before "
            "init_process_group and any CUDA work.",
        ),
        Mistake(
            "06-init-gloo-on-gpus",
            "gloo on a node with GPUs: gloo has only a few collectives for GPU tensors, and they go "
            "through host memory; nccl is the backend for GPUs",
            _backend_where(True, "gloo"),
            hint='Choose the backend by the device: "nccl" where it is a GPU, "gloo" where it is the CPU.',
        ),
        Mistake(
            "06-init-nccl-on-cpu",
            "nccl on a node without GPUs: nccl reduces GPU tensors only. On the CPU the backend is gloo",
            _backend_where(False, "nccl"),
            hint='Choose the backend by the device: "gloo" where it is the CPU, "nccl" only on GPUs.',
        ),
    ),
    covers=("backend", "set-device", "device-from-local-rank"),
)
