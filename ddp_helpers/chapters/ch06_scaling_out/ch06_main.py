"""Notebook 06: main (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ddp_helpers.chapters.ch06_scaling_out.ch06_shared import (
    GPUS_PER_NODE,
    NODES,
    _Recorder,
    _stand_ins,
    gpu_ranks,
    pretend_env,
)
from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen

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

    from ddp_helpers.rank.spec import environment

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
