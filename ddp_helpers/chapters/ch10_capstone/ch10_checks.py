"""Notebook 10's judge and its checks: one run of the learner's script under torchrun (each rank inside the
probe), what a right script does replayed in one process, and each check of a run against it (DDP, the order,
the saves, the checkpoint, the log, the training, the resume), a known mistake by its signature."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ddp_helpers.chapters.ch10_capstone.ch10_contract import (
    CLASSES,
    CLIP,
    DROPOUT,
    EPOCHS,
    EXERCISE,
    FEATURES,
    HIDDEN,
    HINTS,
    LR,
    MOMENTUM,
    POISON_STEP,
    PROBE_DATA_ENV,
    PROBE_DIR_ENV,
    RUN_TIMEOUT_S,
    SEED,
    SHARD,
    STARTUP_TIMEOUT_S,
    STEPS_PER_EPOCH,
    STOP_AT,
)
from ddp_helpers.kernel.exercises.verdict import HUNG, RAISED, UNKNOWN, Verdict
from ddp_helpers.rank.spec import close, differences


@dataclass
class Run:
    """What one run left: each rank's probe record, its output, how it ended, and <out>/ckpt.pt loaded."""

    name: str  # "stopped at step 4", "resumed", "uninterrupted"
    out: Path
    records: list[dict[str, Any] | None]  # per rank, the probe's record (None: the rank left none)
    logs: dict[int, list[str]]
    error: str | None = None
    hung: bool = False
    ckpt: dict[str, Any] | None = None
    ckpt_error: str = ""
    lines: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # per rank, the JSON lines printed

    @property
    def ckpt_path(self) -> str:
        return os.path.abspath(self.out / "ckpt.pt")

    def each(self, name: str) -> list[Any]:
        return [(r or {}).get(name) for r in self.records]


LOG_PREFIX = re.compile(r"^\[rank\d+\]:\s*")


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The log lines among a rank's output: JSON objects with a "loss"."""
    found = []
    for line in lines:
        text = LOG_PREFIX.sub("", line).strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                continue
            if isinstance(value, dict) and "loss" in value:
                found.append(value)
    return found


def launch_run(
    probe: Path,
    script: Path,
    args: list[str],
    world: int,
    folder: Path,
    data: Path,
    name: str,
    extra_env: Mapping[str, str] | None = None,
) -> Run:
    """One run of the script under torchrun, each rank inside the probe; failures become part of the Run."""
    import torch

    from ddp_helpers.errors import LaunchFailed, LaunchTimeout, WorkerFailed
    from ddp_helpers.kernel.launcher.runner import launch

    records_dir = folder / "probe"
    records_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args[args.index("--out") + 1])
    run = Run(name, out, [], {})
    env = {**(extra_env or {}), PROBE_DIR_ENV: str(records_dir), PROBE_DATA_ENV: str(data)}
    try:
        result = launch(
            probe,
            script,
            *args,
            nproc=world,
            run_dir=folder / "launch",
            timeout=RUN_TIMEOUT_S,
            startup_timeout=STARTUP_TIMEOUT_S,
            show_ranks="none",
            progress="off",
            env=env,
        )
        run.logs = result.logs
    except WorkerFailed as error:
        run.error, run.logs = str(error), error.logs
    except LaunchTimeout as error:
        run.error, run.hung = str(error), True
    except LaunchFailed as error:
        run.error = str(error)
    for rank in range(world):
        path = records_dir / f"rank{rank}.json"
        try:
            run.records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            run.records.append(None)
    run.lines = {rank: json_lines(lines) for rank, lines in run.logs.items()}
    if os.path.exists(run.ckpt_path):
        try:
            run.ckpt = torch.load(run.ckpt_path, map_location="cpu", weights_only=True)
        except Exception as error:  # a torn or foreign file: the check says so
            run.ckpt_error = f"{type(error).__name__}: {error}"
    return run


def masks_of(run: Run, steps: int, world: int) -> list[list[Any]] | None:
    """[rank][step] -> the dropout mask drawn (a bool tensor), or None where a step has none."""
    import torch

    out = []
    for record in run.records:
        forwards = (record or {}).get("forwards", [])
        if len(forwards) < steps or any("mask" not in f for f in forwards[:steps]):
            return None
        out.append([torch.tensor([c == "1" for c in f["mask"]]).view(f["shape"]) for f in forwards[:steps]])
    return out if len(out) == world else None


@dataclass(frozen=True)
class Sign:
    """A known mistake: its id, what the learner is told, and its signature in what the check saw."""

    id: str
    message: str
    matches: Callable[[], bool]
    hint: str = ""


class Failed(Exception):
    """A check failed: `verdict` says which, and what the ranks did."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict


@dataclass
class World:
    """One world size being checked: its ranks, its --amp, its tolerances, and where progress lines go."""

    world: int
    amp: str
    where: str  # "at 2 ranks, --amp fp16"
    say: Callable[[str], None]
    wtol: float = 1e-5  # TOLERANCE's, once the first run says which device the ranks trained on
    ltol: float = 1e-5
    notes: list[str] = field(default_factory=list)  # what a passing script does that costs or is unneeded

    def judge(
        self,
        check: str,
        run: Run,
        seen: list[dict[str, Any]],
        expected: list[dict[str, Any]],
        signs: Sequence[Sign] = (),
        tolerance: float = 1e-9,
    ) -> None:
        """Raise Failed with a verdict unless every expected field equals the seen one."""
        found = differences(seen, expected, tolerance)
        diffs = [{"rank": r, "field": f, "seen": s, "expected": e} for r, f, s, e in found]
        if not diffs:
            self.say(f"  ✓ {check}")
            return
        for sign in signs:
            try:
                matched = sign.matches()
            except Exception:  # a signature that cannot read this run does not match it
                matched = False
            if matched:
                message = f"{self.where}, run '{run.name}': {sign.message}"
                self.fail(sign.id, message, seen, expected, diffs, hint=sign.hint)
        if run.error:
            self.raised(run)
        self.fail(
            UNKNOWN,
            f"{self.where}, run '{run.name}': {check}: wrong in a way the checker has no name for; "
            f"{len(diffs)} value(s) differ from what a right script gives (below)",
            seen,
            expected,
            diffs,
        )

    def fail(
        self,
        diagnosis: str,
        message: str,
        seen: Any = (),
        expected: Any = (),
        diffs: Any = (),
        hint: str = "",
    ) -> NoReturn:
        self.say(f"  ✗ {diagnosis}")
        hint = hint or HINTS.get(
            diagnosis, "compare your script with the contract above, flag by flag and line by line."
        )
        raise Failed(
            Verdict(
                EXERCISE, False, diagnosis, message, hint, self.world, list(seen), list(expected), list(diffs)
            )
        )

    def raised(self, run: Run) -> NoReturn:
        kind = HUNG if run.hung else RAISED
        what = f"hung (no output for {RUN_TIMEOUT_S:g}s), and was stopped" if run.hung else "failed"
        self.fail(kind, f"{self.where}, run '{run.name}': your script {what}:\n{run.error}")


def records_or_fail(w: World, run: Run) -> None:
    """A rank that left no record: the script failed before or outside the probe."""
    missing = [r for r, rec in enumerate(run.records) if rec is None]
    if not missing:
        return
    if run.error:
        w.raised(run)
    w.fail(
        UNKNOWN,
        f"{w.where}, run '{run.name}': rank(s) {missing} ended without a record: did the script "
        "end with os._exit()?",
    )


def replay(
    data: dict[str, Any],
    world: int,
    amp: str,
    batches: list[list[list[int]]],
    masks: list[list[Any]],
    steps: int,
    unscale_first: bool = True,
    fresh_at: int | None = None,
    fresh: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What a right script does, step by step, computed in this process on the CPU."""
    import torch

    params = _initial_params()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)

    def new_optimizer() -> Any:
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)

    def new_scaler() -> Any:
        return torch.amp.GradScaler("cpu", enabled=amp == "fp16")

    optimizer, scaler = new_optimizer(), new_scaler()
    out: list[dict[str, Any]] = [{"weights": torch.cat([p.detach().flatten() for p in params]).tolist()}]
    for t in range(steps):
        if t == fresh_at:
            optimizer = new_optimizer() if "optimizer" in fresh else optimizer
            scaler = new_scaler() if "scaler" in fresh else scaler
        ranks = [
            _backward(data, params, batches[rank][t], masks[rank][t], dtype, scaler) for rank in range(world)
        ]
        for i, p in enumerate(
            params
        ):  # DDP's average: each rank's gradient divided by the world size, summed
            p.grad = sum(grads[i] / world for grads, _, _ in ranks)
        finite = all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)
        if unscale_first:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        scaler.step(optimizer)
        scaler.update()
        out.append(
            {
                "losses": [loss for _, loss, _ in ranks],
                "mean": sum(loss * n for _, loss, n in ranks) / sum(n for _, _, n in ranks),
                "stepped": finite or not scaler.is_enabled(),
                "scale": scaler.get_scale() if scaler.is_enabled() else None,
                "weights": torch.cat([p.detach().flatten() for p in params]).tolist(),
            }
        )
    return out


def _initial_params() -> list[Any]:
    """The model's two weights as the contract builds them, right after torch.manual_seed(seed)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        w1 = torch.nn.Linear(FEATURES, HIDDEN, bias=False).weight.detach().clone()
        w2 = torch.nn.Linear(HIDDEN, CLASSES, bias=False).weight.detach().clone()
    return [w1.requires_grad_(), w2.requires_grad_()]


def _backward(
    data: dict[str, Any], params: list[Any], batch: list[int], mask: Any, dtype: Any, scaler: Any
) -> tuple[list[Any], float, int]:
    """One rank's step before DDP's all-reduce: its gradients (of the scaled loss), its loss, its batch size."""
    import torch
    import torch.nn.functional as F

    index = torch.tensor(batch)
    leaves = [p.detach().clone().requires_grad_() for p in params]
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        hidden = torch.tanh(F.linear(data["x"][index], leaves[0]))
        hidden = hidden * (mask.to(hidden.dtype) / (1 - DROPOUT))  # as the probe's dropout applies its mask
        loss = F.cross_entropy(F.linear(hidden, leaves[1]), data["y"][index])
    scaler.scale(loss).backward()
    return [leaf.grad for leaf in leaves], loss.item(), len(batch)


def drift(weights: Sequence[float], expected: Sequence[float], start: Sequence[float]) -> float:
    """How far `weights` are from `expected`, relative to how far training moved the expected ones."""
    if len(weights) != len(expected):
        return math.inf
    off = math.sqrt(sum((a - b) ** 2 for a, b in zip(weights, expected, strict=True)))
    moved = math.sqrt(sum((a - b) ** 2 for a, b in zip(expected, start, strict=True)))
    return off / max(moved, 1e-12) if off == off else math.inf


# ---------------------------------------------------------------------------- the checks
Seen = list[dict[str, Any]]  # per rank, what the check looked at: field -> value


def _first_forward(record: dict[str, Any] | None) -> dict[str, Any]:
    return ((record or {}).get("forwards") or [{}])[0]


def _flat(model: dict[str, Any]) -> list[float]:
    """A state dict's tensors, in key order, as one list of floats."""
    return [float(v) for k in sorted(model) for v in model[k].float().flatten().tolist()]


def check_ddp(w: World, run: Run) -> None:
    weights = [[s["weights"] for s in (r or {}).get("steps", [])] for r in run.records]
    seen = [
        {
            "DDP(...) built": (r or {}).get("ddp", 0) > 0,
            "weights = rank 0's after each step": weights[i] == weights[0],
        }
        for i, r in enumerate(run.records)
    ]
    expected = [dict.fromkeys(row, True) for row in seen]
    wrapped = all(s["DDP(...) built"] for s in seen)
    signs = [
        Sign(
            "10-capstone-no-ddp",
            "DDP(...) wrapped the model, but the ranks' weights parted: the forward went through the raw "
            "model, so backward() averaged nothing."
            if wrapped
            else "no DDP(...) wrapped the model: each rank trained alone.",
            lambda: True,
            hint="call the wrapper in the forward, model(x) with model = DDP(raw, ...), not raw(x)."
            if wrapped
            else "",
        ),
    ]
    w.judge("DDP wraps the model, and every rank holds the same weights", run, seen, expected, signs)


def _by_epoch(batches: list[list[int]]) -> dict[str, list[int]]:
    """The samples of the batches up to the stop, as 'epoch 0' and 'epoch 1 (until the stop)'."""
    return {
        "epoch 0": [i for b in batches[:STEPS_PER_EPOCH] for i in b],
        "epoch 1 (until the stop)": [i for b in batches[STEPS_PER_EPOCH:STOP_AT] for i in b],
    }


def check_order(w: World, run: Run, batches: list[list[list[int]]]) -> None:
    seen: Seen = []
    expected: Seen = []
    for rank, record in enumerate(run.records):
        drawn = [f.get("batch", []) for f in (record or {}).get("forwards", [])][:STOP_AT]
        seen.append(_by_epoch(drawn))
        expected.append(_by_epoch(batches[rank]))
    title = "each rank trains on its own shard, in a new order each epoch"
    w.judge(title, run, seen, expected, _order_signs(w, seen))


def _order_signs(w: World, seen: Seen) -> list[Sign]:
    """A missing sampler (the ranks' samples overlap), its default seed, and a sampler never told the epoch."""
    pad = SHARD * w.world - (SHARD * w.world - 1)

    def overlap() -> bool:  # the ranks' epoch-0 samples overlap beyond the sampler's padding
        sets = [set(s["epoch 0"]) for s in seen]
        shared = sum(len(a & b) for a, b in itertools.combinations(sets, 2))
        return w.world > 1 and shared > pad

    def default_seed() -> bool:  # the order DistributedSampler deals with its default seed, 0, not --seed's
        from ddp_helpers.chapters.ch01_first_program.ch01_exercises import sampler_order

        n = SHARD * w.world - 1
        return all(s["epoch 0"] == sampler_order(n, w.world, rank, 0, 0) for rank, s in enumerate(seen))

    def repeats() -> bool:  # epoch 1 starts as epoch 0 did
        return all(
            s["epoch 1 (until the stop)"] == s["epoch 0"][: len(s["epoch 1 (until the stop)"])]
            and s["epoch 1 (until the stop)"]
            for s in seen
        )

    return [
        Sign(
            "10-capstone-no-sampler",
            "the ranks trained on the same samples: no DistributedSampler dealt them shards.",
            overlap,
        ),
        Sign(
            "10-capstone-sampler-seed",
            f"each rank drew the shard of DistributedSampler's default seed 0, not of --seed {SEED}.",
            default_seed,
        ),
        Sign(
            "10-capstone-no-set-epoch",
            "epoch 1 dealt each rank the same samples in the same order as epoch 0.",
            repeats,
        ),
    ]


def check_masks(w: World, run: Run) -> None:
    first = [_first_forward(r).get("mask") for r in run.records]
    same = "first step's dropout mask = rank 0's"
    seen: Seen = [{}] + [{same: first[rank] == first[0]} for rank in range(1, w.world)]
    expected: Seen = [{}] + [{same: False} for _ in range(1, w.world)]
    seeds = [(r or {}).get("seeds", []) for r in run.records]
    told = (
        f" (every rank's torch.manual_seed calls: {seeds[0]})"
        if seeds[0] and seeds.count(seeds[0]) == w.world
        else ""
    )
    reseeded = any(SEED + rank in seeds[rank] for rank in range(1, w.world))  # seed + rank, then again seed
    signs = [
        Sign(
            "10-capstone-same-masks",
            f"every rank drew the same dropout masks: no rank reseeded with seed + rank{told}.",
            lambda: all(s[same] for s in seen[1:]),
            hint="make torch.manual_seed(args.seed + rank) the last seed before training."
            if reseeded
            else "",
        ),
    ]
    w.judge("each rank draws its own dropout masks", run, seen, expected, signs)


def check_teardown(w: World, run: Run) -> None:
    events = [(r or {}).get("events", []) for r in run.records]
    writes = [i for i, e in enumerate(events[0]) if e in ("save", "replace")]
    last_write = writes[-1] if writes else len(events[0])
    barrier = "a barrier after rank 0's checkpoint"
    seen: Seen = [
        {
            barrier: "barrier" in events[0][last_write:],
            "destroy_process_group()": "destroy_process_group" in events[0],
        }
    ]
    for rank in range(1, w.world):  # the others: a barrier after their last step, where rank 0 saves
        steps = [i for i, e in enumerate(events[rank]) if e == "step"]
        after = events[rank][steps[-1] + 1 :] if steps else events[rank]
        seen.append(
            {barrier: "barrier" in after, "destroy_process_group()": "destroy_process_group" in after}
        )
    expected: Seen = [dict.fromkeys(row, True) for row in seen]
    signs = [
        Sign(
            "10-capstone-no-barrier",
            "a rank went on past rank 0's checkpoint without waiting at a barrier.",
            lambda: not all(s[barrier] for s in seen),
        ),
        Sign(
            "10-capstone-no-teardown",
            "a rank ended without dist.destroy_process_group().",
            lambda: not all(s["destroy_process_group()"] for s in seen),
        ),
    ]
    title = "every rank waits at a barrier after the checkpoint, then destroys its process group"
    w.judge(title, run, seen, expected, signs)


def check_saves(w: World, run: Run) -> None:
    ckpt = run.ckpt_path
    seen: Seen = []
    for record in run.records:
        saves = (record or {}).get("saves", [])
        replaced = [src for src, dst in (record or {}).get("replaces", []) if dst == ckpt]
        how = (
            "in place"
            if ckpt in saves
            else "via a temporary file and os.replace"
            if any(s in saves for s in replaced)
            else "moved into place"
            if replaced
            else "no"
        )
        seen.append({"torch.save calls": len(saves), "ckpt.pt written": how})
    expected: Seen = [{"ckpt.pt written": "via a temporary file and os.replace"}]
    expected += [{"torch.save calls": 0, "ckpt.pt written": "no"} for _ in range(w.world - 1)]
    signs = [
        Sign(
            "10-capstone-every-rank-saves",
            "more ranks than rank 0 called torch.save: N writers can tear one file.",
            lambda: any(s["torch.save calls"] for s in seen[1:]),
        ),
        Sign(
            "10-capstone-not-atomic",
            "rank 0 saved straight into ckpt.pt: a kill during the write leaves it torn.",
            lambda: seen[0]["ckpt.pt written"] == "in place",
        ),
        Sign(
            "10-capstone-no-checkpoint",
            f"no ckpt.pt was written in {run.out} at --stop-at-step {STOP_AT}.",
            lambda: seen[0]["ckpt.pt written"] == "no",
        ),
    ]
    w.judge("rank 0 alone writes ckpt.pt, atomically", run, seen, expected, signs)


def check_ckpt(w: World, run: Run, step: int, want: list[float], start: list[float]) -> None:
    ckpt: dict[str, Any] = run.ckpt if isinstance(run.ckpt, dict) else {}
    model: dict[str, Any] = ckpt["model"] if isinstance(ckpt.get("model"), dict) else {}
    keys = sorted(model)
    flat = _flat(model) if keys == ["fc1.weight", "fc2.weight"] else []
    seen: Seen = [
        {"model keys": keys, "weights off by": round(drift(flat, want, start), 6) if flat else math.inf}
    ]
    seen[0]["other keys"] = sorted(k for k in ckpt if k != "model")
    if run.ckpt_error:
        seen[0]["error"] = run.ckpt_error
    expected: Seen = [{"model keys": ["fc1.weight", "fc2.weight"], "weights off by": 0.0}]
    signs = [
        Sign(
            "10-capstone-module-keys",
            "the checkpoint's model keys start with 'module.': the DDP wrapper's state dict.",
            lambda: all(k.startswith("module.") for k in keys) and bool(keys),
        ),
    ]
    title = f"ckpt.pt holds the plain model's weights after step {step}"
    w.judge(title, run, seen, expected, signs, tolerance=w.wtol)


def check_log(w: World, run: Run, first: int, last: int, sim: list[dict[str, Any]]) -> None:
    lines = [run.lines.get(rank, []) for rank in range(w.world)]
    mine = lines[0]
    seen: Seen = [{"steps logged": [v.get("step") for v in mine], "loss": [v.get("loss") for v in mine]}]
    seen += [{"lines logged": len(lines[r])} for r in range(1, w.world)]
    steps = list(range(first, last + 1))
    expected: Seen = [{"steps logged": steps, "loss": [sim[s]["mean"] for s in steps]}]
    expected += [{"lines logged": 0} for _ in range(1, w.world)]
    local = [sim[s]["losses"][0] for s in steps]
    signs = [
        Sign(
            "10-capstone-every-rank-logs",
            "more ranks than rank 0 printed the log line: N copies of each line.",
            lambda: any(s["lines logged"] for s in seen[1:]),
        ),
        Sign(
            "10-capstone-local-loss",
            "rank 0 logged the loss of its own samples only, not the mean over every rank's.",
            lambda: w.world > 1 and close(seen[0]["loss"], local, w.ltol),
        ),
    ]
    title = f"rank 0 alone logs, steps {first}-{last}, the loss over every rank's samples"
    w.judge(title, run, seen, expected, signs, tolerance=w.ltol)


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
        worst = max(
            (
                drift(s["weights"], against[offset + s["at"]]["weights"], start)
                for s in record.get("steps", [])
                if offset + s["at"] <= last
            ),
            default=0.0,
        )
        return {
            "steps taken": [offset + s["at"] for s in record.get("steps", [])],
            "loss scale": [s["scale"] for s in record.get("scales", [])],
            "weights off by": round(worst, 6),
        }

    seen = [observed(rank, sim) for rank in range(w.world)]
    taken = [s for s in range(first, last + 1) if sim[s]["stepped"]]
    scales = [sim[s]["scale"] for s in range(first, last + 1)] if w.amp == "fp16" else []
    expected = [{"steps taken": taken, "loss scale": scales, "weights off by": 0.0} for _ in range(w.world)]
    scalers = [(r or {}).get("scalers", []) for r in run.records]
    if w.amp != "fp16":  # only fp16 is held to the loss scale; a GradScaler under bf16 changes no weight
        for row in (*seen, *expected):
            row.pop("loss scale")
        if any(s["enabled"] for rank in scalers for s in rank):
            w.notes.append(f"a GradScaler ran under --amp {w.amp}: harmless, but only fp16 needs one")

    def matches(variant: list[dict[str, Any]]) -> Callable[[], bool]:
        scales = [variant[s]["scale"] for s in range(first, last + 1)] if w.amp == "fp16" else []
        return lambda: all(
            observed(rank, variant)["weights off by"] <= tol and close(seen[rank]["loss scale"], scales)
            for rank in range(w.world)
        )

    signs = [_disabled(w, run, scalers), *(Sign(d, m, matches(v)) for d, m, v in variants)]
    signs.append(_overflow_stepped(w, run, seen))
    what = (
        "steps, loss scale and weights after each step" if w.amp == "fp16" else "the weights after each step"
    )
    w.judge(f"{what} as a right script's (steps {first}-{last})", run, seen, expected, signs, tolerance=tol)


def _overflow_stepped(w: World, run: Run, seen: Seen) -> Sign:
    """Under fp16 the overflow step was taken: optimizer.step() beside scaler.step, or no scaler.step."""
    through_scaler = all((r or {}).get("scaler_steps", 0) for r in run.records)
    overflow = f"with --amp fp16 the step with an inf gradient (step {POISON_STEP}) was taken"
    return Sign(
        "10-capstone-overflow-stepped",
        f"{overflow}: the optimizer was stepped outside the scaler too."
        if through_scaler
        else f"{overflow}: no rank called scaler.step(optimizer).",
        lambda: w.amp == "fp16" and any(POISON_STEP in s["steps taken"] for s in seen),
        hint="step the optimizer only through scaler.step(optimizer), which skips an inf step."
        if through_scaler
        else "",
    )


def _disabled(w: World, run: Run, scalers: list[list[dict[str, Any]]]) -> Sign:
    """A GradScaler built disabled under fp16: for another device, or with enabled=False."""
    ranks_on = (run.records[0] or {}).get("device") or "cpu"
    elsewhere = sorted({s["device"] for rank in scalers for s in rank} - {ranks_on, ""})
    if elsewhere:
        message = (
            f"with --amp fp16 the GradScaler was built for '{elsewhere[0]}' (GradScaler() means 'cuda'), not "
            f"the ranks' '{ranks_on}': it turned itself off."
        )
        hint = 'give it the ranks\' device: torch.amp.GradScaler(device.type, enabled=args.amp == "fp16").'
    else:
        message = "with --amp fp16 the GradScaler was built with enabled=False: it scaled nothing."
        hint = 'enable it under fp16: torch.amp.GradScaler(device.type, enabled=args.amp == "fp16").'
    return Sign(
        "10-capstone-scaler-disabled",
        message,
        lambda: w.amp == "fp16" and all(not s["enabled"] for rank in scalers for s in rank) and any(scalers),
        hint=hint,
    )


def check_autocast(w: World, run: Run) -> None:
    want = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(w.amp, "off")
    name = "the first layer's forward under autocast, with dtype"
    seen: Seen = []
    for record in run.records:
        kinds = sorted(
            {f.get("autocast", "off") for f in (record or {}).get("forwards", []) if f.get("batch")}
        )
        seen.append({name: kinds[0] if len(kinds) == 1 else kinds})
    expected: Seen = [{name: want} for _ in run.records]
    signs = [
        Sign(
            "10-capstone-no-autocast",
            f"with --amp {w.amp} the forward ran without autocast for the ranks' device type.",
            lambda: all(s[name] == "off" for s in seen),
        ),
        Sign(
            "10-capstone-autocast-dtype",
            f"with --amp {w.amp} the forward ran under autocast with {seen[0][name]}, not {want}.",
            lambda: all(s[name] not in ("off", want) and isinstance(s[name], str) for s in seen),
        ),
    ]
    w.judge(f"every forward runs under autocast with --amp {w.amp}'s dtype", run, seen, expected, signs)


def check_resume_start(w: World, resumed: Run, batches: list[list[list[int]]]) -> None:
    seen = [{"first batch after the resume": _first_forward(r).get("batch")} for r in resumed.records]
    expected = [{"first batch after the resume": batches[rank][STOP_AT]} for rank in range(w.world)]
    restart = [batches[rank][STEPS_PER_EPOCH] for rank in range(w.world)]
    first = [batches[rank][0] for rank in range(w.world)]
    loaded = any(resumed.ckpt_path in (r or {}).get("loads", []) for r in resumed.records)
    done = STOP_AT - STEPS_PER_EPOCH
    signs = [
        Sign(
            "10-capstone-resume-not-loaded",
            f"with --resume no rank loaded {resumed.ckpt_path}: the run started afresh.",
            lambda: not loaded and [s["first batch after the resume"] for s in seen] == first,
        ),
        Sign(
            "10-capstone-resume-restarts-run",
            "the resumed run loaded ckpt.pt, then began again at epoch 0's first batch.",
            lambda: [s["first batch after the resume"] for s in seen] == first,
        ),
        Sign(
            "10-capstone-resume-restarts-epoch",
            f"the resumed run started epoch 1 again from its first batch: {done} batch(es) trained twice.",
            lambda: [s["first batch after the resume"] for s in seen] == restart,
        ),
    ]
    title = f"the resumed run goes on with step {STOP_AT + 1}, epoch 1's batch {done + 1}"
    w.judge(title, resumed, seen, expected, signs)


def _epochs_trained(forwards: list[dict[str, Any]], batches: list[list[int]]) -> dict[str, list[Any]]:
    """Which batch of which epoch each forward took: 'epoch E' -> [batch numbers from 1]."""
    where: dict[tuple[int, ...], tuple[int, int]] = {}
    for step, batch in enumerate(batches):
        where.setdefault(tuple(batch), (step // STEPS_PER_EPOCH, step % STEPS_PER_EPOCH + 1))
    out: dict[str, list[Any]] = {}
    for forward in forwards:
        batch = forward.get("batch", [])
        if tuple(batch) in where:
            epoch, number = where[tuple(batch)]
            out.setdefault(f"epoch {epoch}", []).append(number)
        else:
            out.setdefault("batches no epoch deals", []).append(batch)
    return out


def check_resume_batches(w: World, resumed: Run, batches: list[list[list[int]]]) -> None:
    done = STOP_AT - STEPS_PER_EPOCH  # batches of epoch 1 trained before the stop
    field = "{}: batches trained after the resume"
    seen: Seen = []
    expected: Seen = []
    for rank, record in enumerate(resumed.records):
        trained = _epochs_trained((record or {}).get("forwards", []), batches[rank])
        seen.append({field.format(e): v for e, v in trained.items()})
        want = {f"epoch {e}": list(range(1, STEPS_PER_EPOCH + 1)) for e in range(1, EPOCHS)}
        want["epoch 1"] = want["epoch 1"][done:]
        expected.append({field.format(e): v for e, v in want.items()})
    later = [field.format(f"epoch {e}") for e in range(2, EPOCHS)]
    cut = list(range(done + 1, STEPS_PER_EPOCH + 1))  # each epoch as the resumed one goes on

    def skips_every_epoch() -> bool:
        return all(s.get(name) == cut for s in seen for name in [field.format("epoch 1"), *later])

    later_epochs = " and ".join(f"epoch {e}" for e in range(2, EPOCHS))
    signs = [
        Sign(
            "10-capstone-resume-skips-every-epoch",
            f"after the resume every epoch began at batch {done + 1}: on every rank {later_epochs} trained "
            f"batches {cut} of {STEPS_PER_EPOCH}.",
            skips_every_epoch,
        ),
    ]
    title = "the resumed run trains every batch left: the rest of epoch 1, then each later epoch whole"
    w.judge(title, resumed, seen, expected, signs)


GENERATORS = {"cpu": "the CPU generator", "cuda": "the GPU's generator"}
AS_AT_STOP = f"as at the stop (step {STOP_AT})"
AS_FRESH = "as freshly seeded, at the run's start"
AS_RANK0 = f"as rank 0's at the stop (step {STOP_AT})"
NEITHER = "neither as at the stop nor as at a fresh start"


def _restored_then_reseeded(record: dict[str, Any] | None) -> tuple[bool, bool]:
    """(torch.set_rng_state called before the first mask, torch.manual_seed called after it, before the mask)."""
    events = (record or {}).get("events", [])
    before = events[: events.index("mask")] if "mask" in events else events
    if "set_rng_state" not in before:
        return False, False
    last = len(before) - 1 - before[::-1].index("set_rng_state")
    return True, "manual_seed" in before[last:]


def _rng_rows(w: World, stopped: Run, resumed: Run) -> tuple[Seen, Seen]:
    """Per rank, each generator's state at the resumed run's first mask, in words; and the right one."""
    after = [_first_forward(r).get("rng") or {} for r in resumed.records]
    fresh = [_first_forward(r).get("rng") or {} for r in stopped.records]
    at_stop = [r or {} for r in stopped.each("rng_exit")]
    step = f"at the first mask after the resume (step {STOP_AT + 1})"
    seen: Seen = []
    expected: Seen = []
    for rank in range(w.world):
        row = {}
        for key, name in GENERATORS.items():
            if key in at_stop[rank]:
                state = after[rank].get(key)
                if state == at_stop[rank][key]:
                    row[f"{name} {step}"] = AS_AT_STOP
                elif state == fresh[rank].get(key):
                    row[f"{name} {step}"] = AS_FRESH
                elif rank > 0 and state == at_stop[0].get(key):
                    row[f"{name} {step}"] = AS_RANK0
                else:
                    row[f"{name} {step}"] = NEITHER
        seen.append(row)
        expected.append(dict.fromkeys(row, AS_AT_STOP))
    return seen, expected


def _generator_states(seen: Seen, key: str) -> list[str]:
    """Every rank's state of one generator ("cpu" or "cuda"), in words."""
    return [v for row in seen for k, v in row.items() if k.startswith(GENERATORS[key])]


def _which(seen: Seen, state: str) -> str:
    """'the CPU generator of ranks 0, 1' for the rows with that state, in words."""
    found: dict[str, list[int]] = {}
    for rank, row in enumerate(seen):
        for k, v in row.items():
            if v == state:
                found.setdefault(k.split(" at the first mask")[0], []).append(rank)
    return "; ".join(
        f"{name} of rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        for name, ranks in found.items()
    )


def check_rng(w: World, stopped: Run, resumed: Run) -> None:
    """Each generator's state at the resumed run's first mask (on GPUs dropout draws from the GPU's), in words."""
    seen, expected = _rng_rows(w, stopped, resumed)
    how = [_restored_then_reseeded(r) for r in resumed.records]
    no_generator = any(not all((r or {}).get("loaders") or [True]) for r in resumed.records)
    signs = [*_rng_fresh_signs(seen, how), *_rng_other_signs(w, seen, how, no_generator)]
    title = "each rank draws on from its own random state as it was at the stop"
    w.judge(title, resumed, seen, expected, signs)


def _rng_fresh_signs(seen: Seen, how: list[tuple[bool, bool]]) -> list[Sign]:
    fresh = _which(seen, AS_FRESH)
    all_fresh = bool(seen) and all(v == AS_FRESH for row in seen for v in row.values())
    return [
        Sign(
            "10-capstone-rng-reseeded",
            f"{fresh} drew step {STOP_AT + 1}'s mask as a fresh start does: a torch.manual_seed after "
            "torch.set_rng_state replaced the restored state.",
            lambda: all_fresh and all(restored and reseeded for restored, reseeded in how),
        ),
        Sign(
            "10-capstone-rng-saved-at-start",
            f"{fresh} drew step {STOP_AT + 1}'s mask as a fresh start does, although a state was restored: "
            "the one saved at the run's start.",
            lambda: all_fresh and all(restored for restored, _ in how),
        ),
        Sign(
            "10-capstone-rng-not-restored",
            f"{fresh} drew step {STOP_AT + 1}'s mask from a freshly seeded state: nothing restored it.",
            lambda: all_fresh,
        ),
    ]


def _rng_other_signs(w: World, seen: Seen, how: list[tuple[bool, bool]], no_generator: bool) -> list[Sign]:
    at_stop, fresh, rank0, neither = (_which(seen, s) for s in (AS_AT_STOP, AS_FRESH, AS_RANK0, NEITHER))
    return [
        Sign(
            "10-capstone-no-loader-generator",
            f"at step {STOP_AT + 1}'s mask {neither} was neither as at the stop nor fresh: a DataLoader "
            "without generator= drew its seed from the restored global generator.",
            lambda: no_generator,
        ),
        Sign(
            "10-capstone-rng-some-ranks",
            f"{at_stop} got its random state back, but {fresh} went on at step {STOP_AT + 1} as freshly seeded.",
            lambda: (
                any(v == AS_AT_STOP for row in seen for v in row.values())
                and all(v in (AS_AT_STOP, AS_FRESH) for row in seen for v in row.values())
                and all(len(set(row.values())) == 1 for row in seen)
            ),
        ),
        Sign(
            "10-capstone-rank0-rng",
            f"{rank0} went on at step {STOP_AT + 1} from rank 0's saved random state, not its own.",
            lambda: w.world > 1 and all(all(v == AS_RANK0 for v in row.values()) for row in seen[1:]),
        ),
        Sign(
            "10-capstone-cuda-rng-not-restored",
            f"every rank got the CPU generator's state back, but not the GPU's ({fresh or neither}, at step "
            f"{STOP_AT + 1}), which dropout draws from on a GPU.",
            lambda: (
                all(v == AS_AT_STOP for v in _generator_states(seen, "cpu"))
                and any(v != AS_AT_STOP for v in _generator_states(seen, "cuda"))
            ),
        ),
        Sign(
            "10-capstone-rng-not-restored",
            f"some rank did not get its own random state back at step {STOP_AT + 1}: "
            f"{'; '.join(filter(None, (fresh, rank0, neither)))} (below).",
            lambda: True,
            hint="restore each rank's own state last, and draw nothing from the global generator before the "
            "first step (no iter(loader) without generator=)."
            if all(restored for restored, _ in how)
            else "",
        ),
    ]


def check_exact(w: World, stopped: Run, resumed: Run, whole: Run, start: list[float]) -> None:
    """The stopped and resumed run against the uninterrupted one: the same steps, the same weights after each."""

    def final(run: Run) -> list[float] | None:
        model = (run.ckpt or {}).get("model") if isinstance(run.ckpt, dict) else None
        return _flat(model) if isinstance(model, dict) else None

    # DDP's first step after a resume packs its bucket in another order: at 3+ ranks the ring's sums differ
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
    title = f"stopped and resumed, the run ends as the uninterrupted one, {how}"
    w.judge(title, whole, seen, expected, tolerance=w.wtol)


def check_loader_seeds(w: World, resumed: Run, whole: Run) -> None:
    field = "the seed each iter(loader) drew after the resume, as the uninterrupted run's in"
    first = STOP_AT // STEPS_PER_EPOCH  # the resumed epoch
    seen: Seen = []
    expected: Seen = []
    for rank in range(w.world):
        draws = (whole.records[rank] or {}).get("iters", [])
        after = (resumed.records[rank] or {}).get("iters", [])
        named = [f"epoch {draws.index(s)}" if s is not None and s in draws else "no epoch" for s in after]
        seen.append({field: named})
        expected.append({field: [f"epoch {e}" for e in range(first, EPOCHS)]})
    firsts = [row[field][:1] for row in seen]
    ranks = ", ".join(map(str, range(w.world)))
    effect = "With num_workers > 0 it seeds each worker, whose random augmentations then differ."
    signs = [
        Sign(
            "10-capstone-loader-state-after-iter",
            f"on every rank ({ranks}) the resumed epoch {first}'s iter(loader) drew epoch {first + 1}'s seed: "
            f"the loader generator's state was saved after that iter(loader) drew. {effect}",
            lambda: all(f == [f"epoch {first + 1}"] for f in firsts),
        ),
        Sign(
            "10-capstone-loader-generator-not-restored",
            f"on every rank ({ranks}) the resumed epoch {first}'s iter(loader) drew epoch 0's seed: the "
            f"loader generator's state was not restored. {effect}",
            lambda: all(f == ["epoch 0"] for f in firsts),
        ),
    ]
    title = (
        f"each iter(loader) after the resume draws the seed the uninterrupted run drew for its epoch "
        f"(epochs {first}-{EPOCHS - 1})"
    )
    w.judge(title, resumed, seen, expected, signs)
