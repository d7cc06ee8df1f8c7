"""Notebook 06's exercises: a rank's start-up on a node of a multi-node job, and its main loop's frame.

One machine cannot show RANK != LOCAL_RANK, so observe calls the answer with the environments of pretend
ranks (2 nodes x 4 GPUs, 2 nodes x 2 CPUs), with `torch.cuda` and `dist` replaced by recording stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, environment

# ------------------------------------------------------------------ the pretend job and its stand-ins
NODES = 2
GPUS_PER_NODE = 4
CPU_PER_NODE = 2


def pretend_env(rank: int, per_node: int) -> dict[str, str]:
    """torchrun's variables for a worker of a job of NODES nodes x `per_node` processes."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % per_node),
        "WORLD_SIZE": str(NODES * per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(rank // per_node),
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
    }


def gpu_ranks(live_rank: int) -> list[int]:
    """One pretend GPU rank on node 0 and one on node 1."""
    world = NODES * GPUS_PER_NODE
    return [live_rank % world, (live_rank + 5) % world]


class _Recorder:
    """What the answer asked of the pretend machine during one call (observe resets it per call)."""

    def __init__(self) -> None:
        self.reset(0, {})

    def reset(self, gpus: int, env: dict[str, str], initialized: bool = False) -> None:
        self.gpus, self.env, self.initialized = gpus, env, initialized  # env: where the group reads RANK
        self.events: list[str] = []
        self.backends: list[Any] = []
        self.set_device: list[Any] = []
        self.current_index = 0


class _FakeCuda:
    """`torch.cuda` and `torch.accelerator` on the pretend node: its GPU count, `set_device` recorded, not done."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def is_available(self) -> bool:
        return self._recorder.gpus > 0

    def device_count(self) -> int:
        return self._recorder.gpus

    def current_device(self) -> int:
        return self._recorder.current_index

    def set_device(self, device: Any) -> None:
        import torch

        index = device if isinstance(device, int) else torch.device(device).index
        self._recorder.set_device.append(index)
        if self._recorder.gpus == 0:
            raise RuntimeError("No CUDA GPUs are available")
        if index is None or not 0 <= index < self._recorder.gpus:
            raise RuntimeError("CUDA error: invalid device ordinal")  # as CUDA says it
        self._recorder.current_index = index

    # torch.accelerator (torch 2.6 and later) is this same pretend GPU set, under its own names
    set_device_index = set_device_idx = set_device
    current_device_index = current_device

    def current_accelerator(self, check_available: bool = False) -> Any:
        import torch

        return torch.device("cuda") if self.is_available() else None

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)


class _FakeTorch:
    """`torch`, but for `torch.cuda` and `torch.accelerator`, which are the pretend node's."""

    def __init__(self, recorder: Any) -> None:
        self.cuda = self.accelerator = _FakeCuda(recorder)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


class _FakeDist:
    """`torch.distributed`, but with the process group's start and end recorded instead of run."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def init_process_group(self, backend: Any = None, *args: Any, **kwargs: Any) -> None:
        self._recorder.backends.append(None if backend is None else str(backend))
        self._recorder.events.append("init_process_group")
        self._recorder.initialized = True

    def is_initialized(self) -> bool:
        return self._recorder.initialized

    # after init_process_group the pretend group answers from the environment, as init_method env:// does
    def _variable(self, name: str) -> int:
        if not self._recorder.initialized:
            raise ValueError(
                "Default process group has not been initialized, please make sure to call init_process_group."
            )
        return int(self._recorder.env[name])

    def get_rank(self, group: Any = None) -> int:
        return self._variable("RANK")

    def get_world_size(self, group: Any = None) -> int:
        return self._variable("WORLD_SIZE")

    def get_node_local_rank(self, fallback_rank: int | None = None) -> int:
        if "LOCAL_RANK" in self._recorder.env:
            return int(self._recorder.env["LOCAL_RANK"])
        if fallback_rank is not None:
            return fallback_rank
        raise RuntimeError("LOCAL_RANK is not in the environment")

    def get_backend(self, group: Any = None) -> str:
        self._variable("RANK")
        return str(self._recorder.backends[-1])

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._recorder.events.append("barrier")

    def destroy_process_group(self, *args: Any, **kwargs: Any) -> None:
        self._recorder.events.append("destroy_process_group")
        self._recorder.initialized = False

    def __getattr__(self, name: str) -> Any:
        import torch.distributed as dist

        return getattr(dist, name)


def _stand_ins(ctx: Context | None = None) -> dict[str, Any]:
    """The answer's stand-in names; rank, world_size and local_rank are None: the answer reads `env`."""
    recorder = _Recorder()
    return {
        "torch": _FakeTorch(recorder),
        "dist": _FakeDist(recorder),
        "rank": None,
        "world_size": None,
        "local_rank": None,
        "_record": recorder,
    }


def _call_as(
    ns: dict[str, Any], function: Any, rank: int, per_node: int, gpus: int, initialized: bool
) -> Any:
    """`function(env)` as the pretend process `rank` would run it: its GPUs, its os.environ, its `env`."""
    ns["_record"].reset(gpus, pretend_env(rank, per_node), initialized)
    with environment(pretend_env(rank, per_node)):  # os.environ too is the pretend process's
        return function(pretend_env(rank, per_node))


# ------------------------------------------------------------------ 06-init
def _probes(live_rank: int) -> list[tuple[int, int, int]]:
    """(rank, processes per node, GPUs per node) of each pretend process a live rank probes."""
    cpu_rank = (live_rank + 3) % (NODES * CPU_PER_NODE)
    return [(r, GPUS_PER_NODE, GPUS_PER_NODE) for r in gpu_ranks(live_rank)] + [(cpu_rank, CPU_PER_NODE, 0)]


def _describe(rank: int, per_node: int, gpus: int) -> str:
    where = f"{gpus} GPUs" if gpus else "no GPU"
    node = f"node {rank // per_node}, LOCAL_RANK {rank % per_node}, {where}"
    return f"init_distributed(env of RANK {rank} of {NODES * per_node}: {node})"


def _outcome(row: dict[str, Any]) -> str:
    # the order of init_process_group and set_device is not checked
    calls = [f"init_process_group({b})" for b in row["backend"]] + [
        f"set_device({i})" for i in row["set_device"]
    ]
    end = f"raised {row['error']}" if row["error"] else f"-> {row['device']}, shard {tuple(row['shard'])}"
    return ", ".join(calls or ["no call"]) + " " + end


def _init_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    function: Any = ns.get("init_distributed")  # None where the answer defined none: the call raises
    out: dict[str, Any] = {"_probes": []}  # "_probes": for the signatures, not compared
    for rank, per_node, gpus in _probes(ctx.rank):
        row: dict[str, Any] = {"error": None, "device": None, "shard": None}
        try:
            device, shard = _call_as(ns, function, rank, per_node, gpus, initialized=False)
            row["device"], row["shard"] = str(device), [int(v) for v in shard]
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"
        row["backend"], row["set_device"] = ns["_record"].backends, ns["_record"].set_device
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
        "Write `init_distributed(env)`: choose the device and backend from torchrun's variables in `env`, "
        "start the process group, and return `(device, (shard_rank, num_shards))` for the sampler."
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
    hint="LOCAL_RANK picks the GPU on a node, RANK of WORLD_SIZE the shard; nccl on GPUs, gloo on the CPU.",
    setup=_stand_ins,
    observe=_init_observe,
    expected=_init_expected,
    mistakes=(
        Mistake(
            "06-init-device-from-rank",
            "a rank of node 1 asked for cuda:RANK (cuda:5 on a node of 4 GPUs).",
            _device_from_rank,
            hint='Take the GPU from int(env["LOCAL_RANK"]), its place on its own node.',
        ),
        Mistake(
            "06-init-shard-from-local-rank",
            "a rank of node 1 took the shard of its LOCAL_RANK: ranks 1 and 5 train on the same samples.",
            _shard_from_local,
            hint='Return (int(env["RANK"]), int(env["WORLD_SIZE"])) as the shard.',
        ),
        Mistake(
            "06-init-no-set-device",
            "torch.cuda.set_device was never called: CUDA work that names no index lands on cuda:0.",
            _no_set_device,
            hint="Call torch.cuda.set_device(device) on GPUs, before any CUDA work.",
        ),
        Mistake(
            "06-init-gloo-on-gpus",
            "gloo on a node with GPUs: torch's docs name NCCL the backend for GPU training, gloo for the CPU.",
            _backend_where(True, "gloo"),
            hint='Use "nccl" where the device is a GPU.',
        ),
        Mistake(
            "06-init-nccl-on-cpu",
            "nccl on a node without GPUs: nccl reduces GPU tensors only.",
            _backend_where(False, "nccl"),
            hint='Use "gloo" where the device is the CPU.',
        ),
    ),
    covers=("backend", "set-device", "device-from-local-rank"),
)


# ------------------------------------------------------------------ 06-main
SEED = 1234
BASE_LR = 0.1  # tuned on one rank: the global batch of one rank's batch
IN_FEATURES, OUT_FEATURES = 4, 2


def _build_model() -> Any:
    import torch

    return torch.nn.Linear(IN_FEATURES, OUT_FEATURES, dtype=torch.float64)  # initialised from torch's RNG


def checksum(model: Any) -> float:
    """Each weight times its place (1, 2, ...), summed."""
    values = [v for p in model.parameters() for v in p.detach().cpu().flatten().tolist()]
    return round(sum((i + 1) * v for i, v in enumerate(values)), 12)


class TrainFailed(RuntimeError):
    pass


def _main_setup(ctx: Context) -> dict[str, Any]:
    import torch

    names = _stand_ins()
    probe: dict[str, Any] = {"calls": [], "fail": False, "rng": torch.get_rng_state()}

    def train(model: Any, lr: float) -> None:
        probe["calls"].append({"lr": float(lr), "init": checksum(model)})
        if probe["fail"]:
            raise TrainFailed("the probe's train() raised, as a failing step would")

    names.update(
        {"seed": SEED, "base_lr": BASE_LR, "build_model": _build_model, "train": train, "_probe": probe}
    )
    return names


def _calls(live_rank: int) -> list[tuple[int, bool]]:
    return [(rank, fail) for rank in gpu_ranks(live_rank) for fail in (False, True)]


def _call_name(rank: int, fail: bool) -> str:
    node = f"node {rank // GPUS_PER_NODE}, LOCAL_RANK {rank % GPUS_PER_NODE}"
    return f"main(env of RANK {rank} of {NODES * GPUS_PER_NODE}: {node})" + (", train raises" if fail else "")


def _call_outcome(call: dict[str, Any]) -> str:
    lr = "no train()" if call["lr"] is None else f"lr {call['lr']:g}, weights {call['init']:.6g}"
    end = " + ".join(call["teardown"]) or "no teardown"
    raised = {True: "raised", False: "returned"}.get(call["raised"], f"raised {call['raised']}")
    return f"{lr}; then {end}; {raised}"


def _main_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    probe = ns["_probe"]
    main: Any = ns.get("main")  # None where the answer defined none: the call raises
    out: dict[str, Any] = {"_calls": []}  # "_calls": for the signatures, not compared
    try:
        for rank, fail in _calls(ctx.rank):
            probe["fail"], probe["calls"] = fail, []
            try:  # main runs after start-up: the group is up
                _call_as(ns, main, rank, GPUS_PER_NODE, GPUS_PER_NODE, initialized=True)
            except TrainFailed:
                raised: bool | str = True
            except Exception as error:
                raised = f"{type(error).__name__}: {error}"
            else:
                raised = False
            trained = probe["calls"][0] if probe["calls"] else {"lr": None, "init": None}
            call = {
                **trained,
                "raised": raised,
                "teardown": [e for e in ns["_record"].events if e != "init_process_group"],
            }
            out["_calls"].append(call)
            out[_call_name(rank, fail)] = _call_outcome(call)
    finally:
        torch.set_rng_state(probe["rng"])  # the live rank's random numbers as they were
    return out


def _main_expected(world: int) -> Seen:
    import torch

    with torch.random.fork_rng(devices=[]):  # the kernel's own random numbers stay as they were
        torch.manual_seed(SEED)
        init = checksum(_build_model())  # what the seeded initialisation gives, whatever the rank
    lr = BASE_LR * NODES * GPUS_PER_NODE  # the linear rule: times the world

    def teardown(raised: bool) -> list[str]:  # the barrier only where train returned
        return ["destroy_process_group"] if raised else ["barrier", "destroy_process_group"]

    def outcome(raised: bool) -> str:
        return _call_outcome({"lr": lr, "init": init, "teardown": teardown(raised), "raised": raised})

    return [{_call_name(r, f): outcome(f) for r, f in _calls(live)} for live in range(world)]


def _all_calls(seen: Seen) -> list[tuple[bool, dict[str, Any]]]:
    pairs = [zip(_calls(live), s.get("_calls") or [], strict=False) for live, s in enumerate(seen)]
    return [(f, got) for calls in pairs for (_, f), got in calls]


def _every_lr(seen: Seen, factor: float) -> bool:
    lrs = [got["lr"] for _, got in _all_calls(seen)]
    return bool(lrs) and all(isinstance(lr, float) and abs(lr - BASE_LR * factor) < 1e-12 for lr in lrs)


def _inits_differ(seen: Seen, expected: Seen) -> bool:
    return len({got["init"] for _, got in _all_calls(seen) if got["init"] is not None}) > 1


def _skipped_on_failure(seen: Seen, expected: Seen) -> bool:
    calls = _all_calls(seen)
    ok = [got["teardown"] for f, got in calls if not f]
    failed = [got["teardown"] for f, got in calls if f]
    return (
        bool(ok and failed)
        and all("destroy_process_group" in t for t in ok)
        and not any("destroy_process_group" in t for t in failed)
    )


def _error_swallowed(seen: Seen, expected: Seen) -> bool:
    failed = [got["raised"] for f, got in _all_calls(seen) if f]
    return bool(failed) and all(raised is False for raised in failed)


def _barrier_in_finally(seen: Seen, expected: Seen) -> bool:
    failed = [got["teardown"] for f, got in _all_calls(seen) if f]
    return bool(failed) and all(t == ["barrier", "destroy_process_group"] for t in failed)


def _no_barrier(seen: Seen, expected: Seen) -> bool:
    calls = _all_calls(seen)
    return bool(calls) and all(got["teardown"] == ["destroy_process_group"] for _, got in calls)


MAIN = Exercise(
    id="06-main",
    notebook="06",
    title="Scale the learning rate, seed the model, tear down in a finally",
    task=(
        "Write `main(env)`: scale `base_lr` by the linear rule, seed with `seed`, `build_model()`, "
        "`train(model, lr)`, a barrier when train returns, and destroy the process group however it ends."
    ),
    starter=(
        "def main(env):\n"
        "    lr = ...  # TODO: base_lr, scaled with the world\n"
        "    # TODO: the same seed on every rank\n"
        "    model = build_model()\n"
        "    train(model, lr)\n"
        "    # TODO: a barrier when train returns; destroy the process group however it ends\n"
    ),
    reference="""\
def main(env):
    world_size = int(env["WORLD_SIZE"])  # every rank of every node, not LOCAL_WORLD_SIZE
    lr = base_lr * world_size  # the linear rule: the global batch is world_size times one rank's
    torch.manual_seed(seed)  # the same seed on every rank, before the model is built
    model = build_model()
    try:
        train(model, lr)  # may raise
        dist.barrier()  # no rank tears down while the others still run (not in finally: see the task)
    finally:  # also when train raised
        dist.destroy_process_group()
""",
    hint="Scale by WORLD_SIZE, seed before the model, and tear down in a `finally:`.",
    setup=_main_setup,
    observe=_main_observe,
    expected=_main_expected,
    mistakes=(
        Mistake(
            "06-main-lr-not-scaled",
            "the learning rate is base_lr on 8 ranks, whose global batch is 8 times one rank's.",
            lambda seen, expected: _every_lr(seen, 1),
            hint='Multiply base_lr by int(env["WORLD_SIZE"]).',
        ),
        Mistake(
            "06-main-lr-local-world",
            "the learning rate was scaled by LOCAL_WORLD_SIZE (4), the ranks of one node, not WORLD_SIZE (8).",
            lambda seen, expected: _every_lr(seen, GPUS_PER_NODE),
            hint="Scale by WORLD_SIZE, the processes of every node.",
        ),
        Mistake(
            "06-main-init-differs",
            "the initial weights differ between calls or ranks: a seed that depends on the rank, no seed, or "
            "one set after the model was built. DDP hides it by copying rank 0's weights; FSDP2 does not.",
            _inits_differ,
            hint="Call torch.manual_seed(seed), the same number on every rank, before build_model().",
        ),
        Mistake(
            "06-main-teardown-skipped",
            "when train raised, destroy_process_group was never called.",
            _skipped_on_failure,
            hint="Call destroy_process_group() in the finally: of a try around train.",
        ),
        Mistake(
            "06-main-barrier-in-finally",
            "a rank whose train raised still went to the barrier in the finally: the others wait for it in "
            "their collectives, and the job hangs instead of failing.",
            _barrier_in_finally,
            hint="Move dist.barrier() into the try, right after train(model, lr).",
        ),
        Mistake(
            "06-main-no-barrier",
            "destroy_process_group came with no barrier before it: a rank may tear down while another still "
            "saves or finishes a collective.",
            _no_barrier,
            hint="Call dist.barrier() in the try, right after train returns.",
        ),
        Mistake(
            "06-main-error-swallowed",
            "where train raised, main returned: an `except` kept the error, so torchrun never hears of it.",
            _error_swallowed,
            hint="Let the error out: try/finally with no except, or a bare `raise` after logging.",
        ),
    ),
    covers=("lr-scaled", "same-init-seed", "teardown"),
)


EXERCISES = (INIT, MAIN)
