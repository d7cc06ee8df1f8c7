"""The checks, each over one run: DDP, the samples' order, the saves, the checkpoint, the log, the training,
the resume's position and random state, and the resumed run against the uninterrupted one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..spec import close
from .contract import POISON_STEP, SHARD, STEPS_PER_EPOCH, STOP_AT
from .judge import Sign, World, steps_of
from .replay import drift
from .runs import Run

Seen = list[dict[str, Any]]  # per rank, what the check looked at: field -> value


def check_ddp(w: World, run: Run) -> None:
    weights = [[s["weights"] for s in (r or {}).get("steps", [])] for r in run.records]
    seen = [
        {
            "DDP(...) built": (r or {}).get("ddp", 0) > 0,
            "weights = rank 0's after each step": weights[i] == weights[0],
        }
        for i, r in enumerate(run.records)
    ]
    expected = [{"DDP(...) built": True, "weights = rank 0's after each step": True} for _ in run.records]
    w.judge("DDP wraps the model, and every rank holds the same weights", run, seen, expected, [
        Sign("10-capstone-no-ddp", "the script trains without DDP: no DDP(...) wrapped the model, or the ranks' "
             "weights parted after a step, so each rank trained alone.", lambda: True),
    ])  # fmt: skip


def check_order(w: World, run: Run, batches: list[list[list[int]]]) -> None:
    """The samples each rank's first layer saw, epoch by epoch, against DistributedSampler's deal."""
    steps = STOP_AT
    seen: Seen = []
    expected: Seen = []
    for rank, record in enumerate(run.records):
        drawn = [f.get("batch", []) for f in (record or {}).get("forwards", [])][:steps]
        seen.append({
            "epoch 0": [i for b in drawn[:STEPS_PER_EPOCH] for i in b],
            "epoch 1 (until the stop)": [i for b in drawn[STEPS_PER_EPOCH:steps] for i in b],
        })  # fmt: skip
        expected.append({
            "epoch 0": [i for b in batches[rank][:STEPS_PER_EPOCH] for i in b],
            "epoch 1 (until the stop)": [i for b in batches[rank][STEPS_PER_EPOCH:steps] for i in b],
        })  # fmt: skip
    pad = SHARD * w.world - (SHARD * w.world - 1)

    def overlap() -> bool:  # the ranks' epoch-0 samples overlap beyond the sampler's padding
        sets = [set(s["epoch 0"]) for s in seen]
        shared = sum(len(a & b) for a, b in itertools.combinations(sets, 2))
        return w.world > 1 and shared > pad

    def repeats() -> bool:  # epoch 1 starts as epoch 0 did
        return all(s["epoch 1 (until the stop)"] == s["epoch 0"][: len(s["epoch 1 (until the stop)"])]
                   and s["epoch 1 (until the stop)"] for s in seen)  # fmt: skip

    w.judge("each rank trains on its own shard, in a new order each epoch", run, seen, expected, [
        Sign("10-capstone-no-sampler", "the ranks trained on the same samples: without a DistributedSampler each "
             "rank goes through the whole dataset.", overlap),
        Sign("10-capstone-no-set-epoch", "epoch 1 dealt each rank the same samples in the same order as epoch 0: "
             "the sampler never learned the epoch.", repeats),
    ])  # fmt: skip


def check_saves(w: World, run: Run) -> None:
    ckpt = run.ckpt_path
    seen: Seen = []
    for record in run.records:
        saves = (record or {}).get("saves", [])
        replaced = [src for src, dst in (record or {}).get("replaces", []) if dst == ckpt]
        how = ("in place" if ckpt in saves else "via a temporary file and os.replace" if any(s in saves for s in
               replaced) else "moved into place" if replaced else "no")  # fmt: skip
        seen.append({"torch.save calls": len(saves), "ckpt.pt written": how})
    expected: Seen = [{"ckpt.pt written": "via a temporary file and os.replace"}]
    expected += [{"torch.save calls": 0, "ckpt.pt written": "no"} for _ in range(w.world - 1)]
    w.judge("rank 0 alone writes ckpt.pt, atomically", run, seen, expected, [
        Sign("10-capstone-every-rank-saves", "more ranks than rank 0 called torch.save: N writers of one file can "
             "leave it torn, and the others' copies are wasted work.",
             lambda: any(s["torch.save calls"] for s in seen[1:])),
        Sign("10-capstone-not-atomic", "rank 0 saved straight into ckpt.pt: a job killed during the write leaves a "
             "torn checkpoint in place of the last good one.", lambda: seen[0]["ckpt.pt written"] == "in place"),
        Sign("10-capstone-no-checkpoint", f"no ckpt.pt was written in {run.out} at --stop-at-step {STOP_AT}.",
             lambda: seen[0]["ckpt.pt written"] == "no"),
    ])  # fmt: skip


def check_ckpt(w: World, run: Run, step: int, want: list[float], start: list[float]) -> None:
    ckpt: dict[str, Any] = run.ckpt if isinstance(run.ckpt, dict) else {}
    model: dict[str, Any] = ckpt["model"] if isinstance(ckpt.get("model"), dict) else {}
    keys = sorted(model)
    flat: list[float] = []
    if keys == ["fc1.weight", "fc2.weight"]:
        flat = [float(v) for k in keys for v in model[k].float().flatten().tolist()]
    seen: Seen = [
        {"model keys": keys, "weights off by": round(drift(flat, want, start), 6) if flat else math.inf}
    ]
    seen[0]["other keys"] = sorted(k for k in ckpt if k != "model")
    if run.ckpt_error:
        seen[0]["error"] = run.ckpt_error
    expected: Seen = [{"model keys": ["fc1.weight", "fc2.weight"], "weights off by": 0.0}]
    w.judge(f"ckpt.pt holds the plain model's weights after step {step}", run, seen, expected, [
        Sign("10-capstone-module-keys", "the checkpoint's model keys start with 'module.': that is the DDP "
             "wrapper's state dict, which a plain model refuses.", lambda: all(k.startswith("module.") for k in keys)
             and bool(keys)),
    ], tolerance=w.wtol)  # fmt: skip


def check_log(w: World, run: Run, first: int, last: int, sim: list[dict[str, Any]]) -> None:
    lines = [run.lines.get(rank, []) for rank in range(w.world)]
    mine = lines[0]
    seen: Seen = [{"steps logged": [v.get("step") for v in mine], "loss": [v.get("loss") for v in mine]}]
    seen += [{"lines logged": len(lines[r])} for r in range(1, w.world)]
    steps = list(range(first, last + 1))
    expected: Seen = [{"steps logged": steps, "loss": [sim[s]["mean"] for s in steps]}]
    expected += [{"lines logged": 0} for _ in range(1, w.world)]
    local = [sim[s]["losses"][0] for s in steps]
    w.judge(f"rank 0 alone logs, steps {first}-{last}, the loss over every rank's samples", run, seen, expected, [
        Sign("10-capstone-every-rank-logs", "more ranks than rank 0 printed the log line: N copies of each line.",
             lambda: any(s["lines logged"] for s in seen[1:])),
        Sign("10-capstone-local-loss", "rank 0 logged the loss of its own samples only: each rank sees its own "
             "shard, so the mean over all samples needs every rank's sum and count.",
             lambda: w.world > 1 and close(seen[0]["loss"], local, w.ltol)),
    ], tolerance=w.ltol)  # fmt: skip


def check_training(
    w: World,
    run: Run,
    first: int,
    sim: list[dict[str, Any]],
    variants: Sequence[tuple[str, str, list[dict[str, Any]]]] = (),
) -> None:
    """The steps taken, the loss scale and the weights after each step, against the replay (from step `first`)."""
    offset = first - 1
    tol = w.wtol
    start = sim[0]["weights"]
    last = len(sim) - 1

    def observed(rank: int, against: list[dict[str, Any]]) -> dict[str, Any]:
        record = run.records[rank] or {}
        worst = max((drift(s["weights"], against[offset + s["at"]]["weights"], start)
                     for s in record.get("steps", []) if offset + s["at"] <= last), default=0.0)  # fmt: skip
        return {
            "steps taken": steps_of(run, rank, offset),
            "loss scale": [s["scale"] for s in record.get("scales", [])],
            "weights off by": round(worst, 6),
        }

    seen = [observed(rank, sim) for rank in range(w.world)]
    taken = [s for s in range(first, last + 1) if sim[s]["stepped"]]
    scales = [sim[s]["scale"] for s in range(first, last + 1)] if w.amp == "fp16" else []
    expected = [{"steps taken": taken, "loss scale": scales, "weights off by": 0.0} for _ in range(w.world)]

    def matches(variant: list[dict[str, Any]]) -> Callable[[], bool]:
        scales = [variant[s]["scale"] for s in range(first, last + 1)] if w.amp == "fp16" else []
        return lambda: all(observed(rank, variant)["weights off by"] <= tol
                           and close(seen[rank]["loss scale"], scales) for rank in range(w.world))  # fmt: skip

    signs = [Sign(d, m, matches(v)) for d, m, v in variants]
    signs.append(
        Sign(
            "10-capstone-overflow-stepped",
            f"with --amp fp16 the step with an inf gradient (step "
            f"{POISON_STEP}) was taken: the optimizer stepped on an overflow.",
            lambda: w.amp == "fp16" and any(POISON_STEP in s["steps taken"] for s in seen),
        )
    )
    what = (
        "steps, loss scale and weights after each step" if w.amp == "fp16" else "the weights after each step"
    )
    w.judge(f"{what} as a right script's (steps {first}-{last})", run, seen, expected, signs, tolerance=tol)


def check_resume_start(w: World, resumed: Run, batches: list[list[list[int]]]) -> None:
    seen = [{"first batch after the resume": (((r or {}).get("forwards") or [{}])[0]).get("batch")}
            for r in resumed.records]  # fmt: skip
    expected = [{"first batch after the resume": batches[rank][STOP_AT]} for rank in range(w.world)]
    restart = [batches[rank][STEPS_PER_EPOCH] for rank in range(w.world)]
    w.judge(f"the resumed run goes on with step {STOP_AT + 1}, epoch 1's batch {STOP_AT - STEPS_PER_EPOCH + 1}",
            resumed, seen, expected, [
        Sign("10-capstone-resume-restarts-epoch", f"the resumed run started epoch 1 again from its first batch: the "
             f"{STOP_AT - STEPS_PER_EPOCH} batch(es) trained before the stop are trained twice.",
             lambda: [s["first batch after the resume"] for s in seen] == restart),
    ])  # fmt: skip


def check_rng(w: World, stopped: Run, resumed: Run) -> None:
    first = [(((r or {}).get("forwards") or [{}])[0]).get("rng") for r in resumed.records]
    fresh = [(((r or {}).get("forwards") or [{}])[0]).get("rng") for r in stopped.records]
    seen = [{"random state at the first mask": f} for f in first]
    expected = [{"random state at the first mask": r} for r in stopped.each("rng_exit")]
    no_generator = any(not all((r or {}).get("loaders") or [True]) for r in resumed.records)
    w.judge("each rank draws on from its own random state as it was at the stop", resumed, seen, expected, [
        Sign("10-capstone-rng-not-restored", "the resumed ranks drew their dropout masks from freshly seeded "
             "generators, not from the random state each had at the stop.", lambda: first == fresh),
        Sign("10-capstone-no-loader-generator", "the random state was restored, then iter(loader) drew from it: a "
             "DataLoader without generator= takes its seed from the global generator at every iter().",
             lambda: no_generator),
        Sign("10-capstone-rng-not-restored", "some rank did not get its own random state back: each rank's masks "
             "must go on from the state that rank had at the stop.", lambda: True),
    ])  # fmt: skip


def check_exact(w: World, stopped: Run, resumed: Run, whole: Run, start: list[float]) -> None:
    """The stopped and resumed run against the uninterrupted one: the same steps, the same weights after each.

    Bit for bit at 1 or 2 ranks. At 3 or more, to float32's last bits: DDP's first iteration packs the
    gradients into its bucket in parameter order, and later ones in the order backward produced them, so the
    first step after a resume all-reduces each number in another position of the bucket, and with 3 or more
    ranks the ring adds the ranks' shares in an order that depends on that position."""

    def final(run: Run) -> list[float] | None:
        model = (run.ckpt or {}).get("model") if isinstance(run.ckpt, dict) else None
        if not isinstance(model, dict):
            return None
        return [float(v) for k in sorted(model) for v in model[k].float().flatten().tolist()]

    exact = w.world <= 2
    same = (
        "weights = the uninterrupted run's, bit for bit"
        if exact
        else "weights off from the uninterrupted run's"
    )
    seen: Seen = []
    expected: Seen = []
    for rank in range(w.world):
        split = {s["at"]: s["weights"] for s in (stopped.records[rank] or {}).get("steps", [])}
        split |= {STOP_AT + s["at"]: s["weights"] for s in (resumed.records[rank] or {}).get("steps", [])}
        alone = {s["at"]: s["weights"] for s in (whole.records[rank] or {}).get("steps", [])}
        seen.append({"steps taken": sorted(split), "steps taken, uninterrupted": sorted(alone)})
        expected.append({"steps taken": sorted(alone)})
        if exact:
            parted = [step for step in sorted(alone) if split.get(step) != alone[step]]
            seen[-1][same] = not parted and bool(alone)
            if parted:
                seen[-1]["first step that differs"] = parted[0]
            expected[-1][same] = True
        else:
            off = [drift(split[step], alone[step], start) for step in sorted(alone) if step in split]
            seen[-1][same] = round(max(off, default=math.inf), 9)
            expected[-1][same] = 0.0
    ends = (final(resumed), final(whole))
    if exact:
        seen[0]["ckpt.pt = the uninterrupted run's"] = ends[0] == ends[1] and ends[1] is not None
        expected[0]["ckpt.pt = the uninterrupted run's"] = True
    how = (
        "bit for bit"
        if exact
        else "to float32's last bits (at 3 or more ranks DDP's first step sums in another order)"
    )
    w.judge(f"stopped and resumed, the run ends as the uninterrupted one, {how}", whole, seen, expected,
            tolerance=w.wtol)  # fmt: skip
