"""Notebook 06's exercises: a rank's start-up on a node of a multi-node job, and its main loop's frame.

The live ranks all sit on one machine, where RANK and LOCAL_RANK are equal and so are WORLD_SIZE and
LOCAL_WORLD_SIZE: there, the mistakes these exercises name cannot show. So the answer is a function of
an environment, `env`, that observe calls with pretend ones: ranks of a job of 2 nodes x 4 GPUs (8 ranks),
and of 2 nodes x 2 CPU processes. Stand-ins record what the function asks of the machine: `torch.cuda`
reports the pretend node's GPUs and records `set_device` (refusing an index the node does not have, as
CUDA does), and `dist` records `init_process_group`, `barrier` and `destroy_process_group` instead of
running them (the live ranks' process group stays up). Everything else reaches torch itself. During each
call `os.environ` holds the pretend process's variables too, as a worker's does under torchrun: an answer
that reads them there, as a script does, is judged by what it does with them. A verdict names each call by
the pretend process it stands for, "main(env of RANK 5 of 8: node 1, LOCAL_RANK 1)", after the live rank
that made it.
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
    """What torchrun puts in a worker's environment on a job of NODES nodes x `per_node` processes."""
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
    """The pretend GPU ranks a live rank probes: one on node 0 and one on node 1, as (r, r + 5) mod 8."""
    world = NODES * GPUS_PER_NODE
    return [live_rank % world, (live_rank + 5) % world]


def cpu_rank(live_rank: int) -> int:
    return (live_rank + 3) % (NODES * CPU_PER_NODE)


class _Recorder:
    """What the answer asked of the pretend machine during one call."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.events: list[str] = []
        self.backends: list[Any] = []
        self.set_device: list[Any] = []
        self.current_index = 0
        self.initialized = False
        self.env: dict[str, str] = {}  # the pretend process's environment, where its process group reads RANK


class _FakeCuda:
    """`torch.cuda` on the pretend node: its GPU count, and `set_device` recorded, not done."""

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

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)


class _FakeAccelerator:
    """`torch.accelerator` (torch 2.6 and later) on the pretend node, as `_FakeCuda`."""

    def __init__(self, cuda: _FakeCuda) -> None:
        self._cuda = cuda

    def is_available(self) -> bool:
        return self._cuda.is_available()

    def device_count(self) -> int:
        return self._cuda.device_count()

    def current_accelerator(self, check_available: bool = False) -> Any:
        import torch

        return torch.device("cuda") if self._cuda.is_available() else None

    def set_device_index(self, device: Any) -> None:
        self._cuda.set_device(device)

    set_device_idx = set_device_index

    def current_device_index(self) -> int:
        return self._cuda.current_device()


class _FakeTorch:
    """`torch`, but for `torch.cuda` and `torch.accelerator`, which are the pretend node's."""

    def __init__(self, recorder: Any) -> None:
        self.cuda = _FakeCuda(recorder)
        self.accelerator = _FakeAccelerator(self.cuda)

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

    # After init_process_group, the pretend group answers as torchrun's environment says (init_method env://
    # reads RANK and WORLD_SIZE): an answer may take its rank from dist.get_rank(), as most tutorials do.
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
        """torch 2.4 and later: LOCAL_RANK from the environment, as torch reads it (no group needed)."""
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


def _stand_ins() -> dict[str, Any]:
    """The names whose stand-ins replace the real ones in the answer's namespace, and the recorder they
    share (observe points it at a fresh record before each call). rank, world_size and local_rank are the
    live ranks', which a multi-node job does not have: here they are None, and the function reads `env`."""
    recorder = _Recorder(0)
    holder = _Holder(recorder)
    return {
        "torch": _FakeTorch(holder),
        "dist": _FakeDist(holder),
        "rank": None,
        "world_size": None,
        "local_rank": None,
        "_record": holder,
    }


class _Holder:
    """The recorder of the call in progress: the stand-ins read through it, observe swaps it per call."""

    def __init__(self, recorder: _Recorder) -> None:
        object.__setattr__(self, "current", recorder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "current":
            object.__setattr__(self, name, value)
        else:
            setattr(self.current, name, value)


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


# ------------------------------------------------------------------ 06-main
SEED = 1234
BASE_LR = 0.1  # tuned on one rank: the global batch of one rank's batch
IN_FEATURES, OUT_FEATURES = 4, 2


def _build_model() -> Any:
    import torch

    return torch.nn.Linear(IN_FEATURES, OUT_FEATURES, dtype=torch.float64)  # initialised from torch's RNG


def checksum(model: Any) -> float:
    """One number for a model's weights: each value times its place (1, 2, ...), summed."""
    values = [v for p in model.parameters() for v in p.detach().cpu().flatten().tolist()]
    return round(sum((i + 1) * v for i, v in enumerate(values)), 12)


class TrainFailed(RuntimeError):
    """The probe's training failing, as a step that raises would."""


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
    """(pretend rank, whether train raises) of each call of main a live rank makes."""
    return [(rank, fail) for rank in gpu_ranks(live_rank) for fail in (False, True)]


def _call_name(rank: int, fail: bool) -> str:
    """A call of main, with the pretend process it stands for (the verdict puts the live rank before it)."""
    node = f"node {rank // GPUS_PER_NODE}, LOCAL_RANK {rank % GPUS_PER_NODE}"
    return f"main(env of RANK {rank} of {NODES * GPUS_PER_NODE}: {node})" + (", train raises" if fail else "")


def _call_outcome(call: dict[str, Any]) -> str:
    """One call of main in one short line: the lr and the initial weights train got, then the teardown."""
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
            recorder = _Recorder(GPUS_PER_NODE)
            recorder.env = dict(pretend_env(rank, GPUS_PER_NODE))  # what the pretend group answers
            recorder.initialized = True  # main runs after start-up: dist.get_world_size() answers
            ns["_record"].current = recorder
            probe["fail"], probe["calls"] = fail, []
            try:  # os.environ too is the pretend process's: an answer may read it, as a script does
                with environment(pretend_env(rank, GPUS_PER_NODE)):
                    main(dict(pretend_env(rank, GPUS_PER_NODE)))
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
                "teardown": [e for e in recorder.events if e != "init_process_group"],
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

    return [
        {_call_name(r, f): _call_outcome({"lr": lr, "init": init, "teardown": teardown(f), "raised": f})
         for r, f in _calls(live)}
        for live in range(world)
    ]  # fmt: skip


def _all_calls(seen: Seen) -> list[tuple[bool, dict[str, Any]]]:
    """(whether train raised, what the call did) of every call of main on every live rank."""
    return [(f, got) for live, s in enumerate(seen)
            for (_, f), got in zip(_calls(live), s.get("_calls") or [], strict=False)]  # fmt: skip


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
        "Write `main(env)`: set `lr` to `base_lr` scaled by the linear rule (`base_lr` was tuned on one "
        "rank; each rank keeps its batch, so the global batch grows with the world), seed torch's "
        "generator with `seed` so that every rank builds the same initial model with `build_model()`, "
        "call `train(model, lr)`; when it returns, wait for every rank at a barrier, and however train ends "
        "(it may raise), destroy the process group. The barrier stays out of the `finally`: a rank whose "
        "train raised would wait there while the others wait in their training collectives. The checker "
        "calls it as ranks of 2 nodes x 4 GPUs."
    ),
    given=(
        "`env` (torchrun's variables, as in `os.environ`), `seed`, `base_lr`, `build_model()`, "
        "`train(model, lr)`, `torch`, `dist` (its process group is up: `get_rank()` and `get_world_size()` "
        "answer as the pretend job's; its `barrier` and `destroy_process_group` are recorded, not run); "
        "`rank`, `world_size` and `local_rank` are None here: read `env` or ask `dist`"
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
    hint=(
        "WORLD_SIZE counts the ranks of every node; LOCAL_WORLD_SIZE those of one. The seed comes before "
        "the model and is the same number on every rank. `finally:` runs when the block raises, too."
    ),
    setup=_main_setup,
    observe=_main_observe,
    expected=_main_expected,
    mistakes=(
        Mistake(
            "06-main-lr-not-scaled",
            "the learning rate is base_lr on 8 ranks: the global batch is 8 times one rank's, and with the "
            "linear rule the learning rate follows it (times WORLD_SIZE)",
            lambda seen, expected: _every_lr(seen, 1),
            hint='Multiply base_lr by the world size, int(env["WORLD_SIZE"]): the global batch grows with it.',
        ),
        Mistake(
            "06-main-lr-local-world",
            "the learning rate was scaled by LOCAL_WORLD_SIZE (4), the ranks of one node; the global batch "
            "is summed over every node's ranks: WORLD_SIZE (8)",
            lambda seen, expected: _every_lr(seen, GPUS_PER_NODE),
            hint="Scale by WORLD_SIZE, the processes of every node, not LOCAL_WORLD_SIZE, those of one.",
        ),
        Mistake(
            "06-main-init-differs",
            "the model's initial weights differ from call to call or rank to rank: a seed that depends on "
            "the rank (seed + rank), no seed, or a seed set after the model was built. DDP's constructor "
            "copies rank 0's parameters and buffers to the others, which hides it there; FSDP2's fully_shard "
            "copies nothing (FSDP1 only with sync_module_states=True), and any check before the wrap sees "
            "different models",
            _inits_differ,
            hint="Call torch.manual_seed(seed) with `seed` itself, the same number on every rank (nothing "
            "added), before build_model().",
        ),
        Mistake(
            "06-main-teardown-skipped",
            "when train raised, destroy_process_group was never called: it is not in a finally, so a failing "
            "rank leaves without tearing down its process group",
            _skipped_on_failure,
            hint="Put train and the barrier in a try:, and destroy_process_group() in its finally:, which "
            "runs when train raises too.",
        ),
        Mistake(
            "06-main-barrier-in-finally",
            "a rank whose train raised still went to the barrier: it stands in the finally, so the failing "
            "rank waits there while the others wait for it in their training collectives, and the job hangs "
            "instead of failing (torchrun never hears of the error). The barrier belongs after train returns",
            _barrier_in_finally,
            hint="Move dist.barrier() out of the finally, into the try, right after train(model, lr): it then "
            "runs only when train returned. The finally keeps destroy_process_group() alone.",
        ),
        Mistake(
            "06-main-no-barrier",
            "destroy_process_group came with no barrier before it: the ranks tear down one by one as each "
            "finishes, while another may still be saving a checkpoint, or (on NCCL, whose collectives run on "
            "the GPU after the call returns) still finishing a last collective with them",
            _no_barrier,
            hint="Call dist.barrier() in the try, right after train returns, so that every rank has finished "
            "before any tears down.",
        ),
        Mistake(
            "06-main-error-swallowed",
            'where train raised, main returned ("returned" below, where a right answer raised): an '
            "`except` caught train's error and did not raise it again, so the failing process exits 0: "
            "torchrun never hears of the failure and does not stop or restart the job, and the other ranks "
            "can wait for it in their next collective until it times out",
            _error_swallowed,
            hint="Let train's error out: no `except` around train (try/finally alone does the teardown), or "
            "end the except with a bare `raise` after logging, so that the process fails and torchrun sees it.",
        ),
    ),
    covers=("lr-scaled", "same-init-seed", "teardown"),
)


EXERCISES = (INIT, MAIN)
