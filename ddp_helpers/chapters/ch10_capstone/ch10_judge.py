"""Notebook 10's judge: one run of the learner's script under torchrun (each rank inside the probe), what a
right script does replayed in one process, and a check's verdict against it, a known mistake by its signature."""

from __future__ import annotations

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
    EXERCISE,
    FEATURES,
    HIDDEN,
    HINTS,
    LR,
    MOMENTUM,
    PROBE_DATA_ENV,
    PROBE_DIR_ENV,
    RUN_TIMEOUT_S,
    SEED,
    STARTUP_TIMEOUT_S,
)
from ddp_helpers.kernel.exercises.verdict import HUNG, RAISED, UNKNOWN, Verdict
from ddp_helpers.rank.spec import differences


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


def steps_of(run: Run, rank: int, offset: int = 0) -> list[int]:
    """The steps at which `rank` stepped its optimizer, numbered from `offset` + 1."""
    return [offset + s["at"] for s in (run.records[rank] or {}).get("steps", [])]


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
        _all_reduce(params, [grads for grads, _, _ in ranks])
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


def _all_reduce(params: list[Any], grads: list[list[Any]]) -> None:
    """DDP's average: each rank's gradient divided by the world size, then summed, into each param's .grad."""
    import torch

    for i, p in enumerate(params):
        p.grad = torch.zeros_like(p)
        for rank in grads:
            p.grad += rank[i] / len(grads)


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
