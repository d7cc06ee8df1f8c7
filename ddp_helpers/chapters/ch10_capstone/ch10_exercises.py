"""Notebook 10's capstone check: the learner's whole script run under torchrun at each world size (stopped,
resumed, uninterrupted), each run's checks in order, judged against a replay in one process.

    verdict = check_script("runs/capstone/my_ddp.py")  # 2 ranks with --amp fp16, then 3 with --amp bf16"""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_helpers.chapters.ch10_capstone import ch10_checks as checks
from ddp_helpers.chapters.ch10_capstone.ch10_checks import (
    Failed,
    Run,
    World,
    launch_run,
    masks_of,
    records_or_fail,
    replay,
)
from ddp_helpers.chapters.ch10_capstone.ch10_contract import (
    AMP_MODES,
    CLIP,
    EXERCISE,
    STOP_AT,
    TOLERANCE,
    TOTAL_STEPS,
    expected_batches,
    make_data,
    script_args,
)
from ddp_helpers.chapters.ch10_capstone.ch10_probe import PROBE
from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.exercises.verdict import PASSED, UNKNOWN, Verdict

__all__ = ["EXERCISE", "amp_plan", "check_script"]


def _valid_script(script: str | os.PathLike[str]) -> Path:
    if not isinstance(script, str | os.PathLike):
        raise InvalidLaunchArguments(f"script must be a path to a .py file, got {type(script).__name__}")
    path = Path(script)
    if not path.is_file():
        raise InvalidLaunchArguments(f"no script at {path.resolve()}: write it first (the %%writefile cell)")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidLaunchArguments(f"cannot read {path}: {error}") from None
    try:
        ast.parse(source, str(path))
    except SyntaxError as error:
        raise InvalidLaunchArguments(
            f"{path} has a syntax error at line {error.lineno}: {error.msg}"
        ) from None
    return path.resolve()


def _valid_worlds(nproc: Sequence[int] | int) -> tuple[int, ...]:
    worlds = (nproc,) if isinstance(nproc, int) else nproc
    try:
        worlds = tuple(worlds)
    except TypeError:
        raise InvalidLaunchArguments(f"nproc must be world sizes, such as (2, 3); got {nproc!r}") from None
    if not worlds or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in worlds):
        raise InvalidLaunchArguments(
            f"nproc must be one or more world sizes of at least 1, such as (2, 3); got {nproc!r}"
        )
    return worlds


def amp_plan(worlds: Sequence[int], amp: str | None = None) -> list[tuple[int, str]]:
    """(world size, --amp) for each check, in order: every --amp mode of the contract runs at least once."""
    if amp is not None:
        return [(world, amp) for world in worlds]
    if len(worlds) < len(AMP_MODES):
        return [(world, mode) for world in worlds for mode in AMP_MODES]
    return [(world, AMP_MODES[i % len(AMP_MODES)]) for i, world in enumerate(worlds)]


@dataclass
class Stage:
    """What the three runs of one world size share."""

    w: World
    script: Path
    probe: Path
    folder: Path
    data_path: Path
    data: dict[str, Any]
    batches: list[list[list[int]]]
    env: Mapping[str, str] | None = None  # extra environment for the ranks

    def run(self, name: str, label: str, out: str, *flags: str) -> Run:
        args = script_args(self.data_path, self.folder / out / "out", self.w.amp, *flags)
        return launch_run(
            self.probe, self.script, args, self.w.world, self.folder / name, self.data_path, label, self.env
        )


def check_world(
    script: Path,
    probe: Path,
    folder: Path,
    world: int,
    amp: str,
    say: Callable[[str], None],
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run and judge `script` at `world` ranks (judge.Failed at the first failed check); a passing one's notes."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    data = make_data(world)
    torch.save(data, folder / "data.pt")
    w = World(world, amp, f"at {world} rank(s), --amp {amp}", say)
    stage = Stage(w, script, probe, folder, folder / "data.pt", data, expected_batches(world), env)
    stopped, masks = _stopped(stage)
    resumed, start = _resumed(stage, stopped, masks)
    say(f"{EXERCISE} {w.where}: run 3 of 3, uninterrupted")
    whole = stage.run("whole", "uninterrupted", "whole", "--stop-at-step", "0")
    records_or_fail(w, whole)
    if whole.error:
        w.raised(whole)
    checks.check_exact(w, stopped, resumed, whole, start)
    checks.check_loader_seeds(w, resumed, whole)
    return w.notes


def _stopped(stage: Stage) -> tuple[Run, list[list[Any]]]:
    w = stage.w
    w.say(f"{EXERCISE} {w.where}: run 1 of 3, stopped at step {STOP_AT} (--stop-at-step {STOP_AT})")
    stopped = stage.run("stopped", f"stopped at step {STOP_AT}", "stopped", "--stop-at-step", str(STOP_AT))
    records_or_fail(w, stopped)
    device = (stopped.records[0] or {}).get("device") or "cpu"
    w.wtol, w.ltol = TOLERANCE["cpu" if device == "cpu" else "cuda", w.amp]
    if stopped.error and not all(stopped.each("steps")):
        w.raised(stopped)  # it failed before every rank took a step: nothing below could be judged
    checks.check_ddp(w, stopped)
    checks.check_order(w, stopped, stage.batches)
    checks.check_masks(w, stopped)
    checks.check_autocast(w, stopped)
    checks.check_saves(w, stopped)
    checks.check_teardown(w, stopped)
    if stopped.error:
        w.raised(stopped)
    masks = masks_of(stopped, STOP_AT, w.world)
    if masks is None:
        w.fail(
            UNKNOWN,
            f"{w.where}, run '{stopped.name}': some rank drew no dropout mask in a step: train the "
            "contract's Net (its nn.Dropout) in train mode, one forward per step.",
        )
    sim = replay(stage.data, w.world, w.amp, stage.batches, masks, STOP_AT)
    variants = []
    if w.amp == "fp16":
        variants.append(
            (
                "10-capstone-no-unscale",
                f"the gradients were clipped to {CLIP:g} while still multiplied by the loss scale "
                f"({sim[1]['scale']:g}): the updates are thousands of times too small.",
                replay(stage.data, w.world, w.amp, stage.batches, masks, STOP_AT, unscale_first=False),
            )
        )
    checks.check_training(w, stopped, 1, sim, variants)  # before the log: wrong weights make every loss wrong
    checks.check_log(w, stopped, 1, STOP_AT, sim)
    checks.check_ckpt(w, stopped, STOP_AT, sim[STOP_AT]["weights"], sim[0]["weights"])
    return stopped, masks


def _resumed(stage: Stage, stopped: Run, masks: list[list[Any]]) -> tuple[Run, list[float]]:
    w = stage.w
    w.say(f"{EXERCISE} {w.where}: run 2 of 3, resumed (--resume)")
    resumed = stage.run("resumed", "resumed", "stopped", "--stop-at-step", "0", "--resume")
    records_or_fail(w, resumed)
    if resumed.error and not all(resumed.each("forwards")):
        w.raised(resumed)
    checks.check_resume_start(w, resumed, stage.batches)
    checks.check_rng(w, stopped, resumed)
    if resumed.error:
        w.raised(resumed)
    checks.check_resume_batches(w, resumed, stage.batches)
    later = masks_of(resumed, TOTAL_STEPS - STOP_AT, w.world)
    if later is None:
        w.fail(
            UNKNOWN,
            f"{w.where}, run 'resumed': the resumed run did not take the {TOTAL_STEPS - STOP_AT} steps "
            f"left after step {STOP_AT}, one forward each.",
        )
    masks = [a + b for a, b in zip(masks, later, strict=True)]

    def again(**variant: Any) -> list[dict[str, Any]]:
        return replay(stage.data, w.world, w.amp, stage.batches, masks, TOTAL_STEPS, **variant)

    sim = again()
    variants = [
        (
            "10-capstone-scaler-not-restored",
            "the resumed run started with a fresh GradScaler: the loss scale came back at its initial value.",
            again(fresh_at=STOP_AT, fresh=("scaler",)),
        ),
        (
            "10-capstone-optimizer-not-restored",
            "the resumed run started with a fresh optimizer: the momentum built up before the stop was lost.",
            again(fresh_at=STOP_AT, fresh=("optimizer",)),
        ),
    ]
    checks.check_training(w, resumed, STOP_AT + 1, sim, variants)
    checks.check_log(w, resumed, STOP_AT + 1, TOTAL_STEPS, sim)
    checks.check_ckpt(w, resumed, TOTAL_STEPS, sim[TOTAL_STEPS]["weights"], sim[0]["weights"])
    return resumed, sim[0]["weights"]


def check_script(
    script: str | os.PathLike[str],
    nproc: Sequence[int] | int = (2, 3),
    workdir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    amp: str | None = None,
    envs: Mapping[int, Mapping[str, str]] | None = None,
) -> Verdict:
    """Run `script` under torchrun at each world size in `nproc`, as the contract says, and judge it."""
    path = _valid_script(script)
    worlds = _valid_worlds(nproc)
    if amp is not None and amp not in AMP_MODES:
        raise InvalidLaunchArguments(f"amp must be one of {', '.join(AMP_MODES)} or None, got {amp!r}")
    base = Path(workdir) if workdir is not None else Path("runs") / "capstone"
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="check-", dir=base)).resolve()  # one per check, never reused
    probe = folder / "probe.py"
    probe.write_text(PROBE)

    def say(line: str) -> None:
        if progress:
            print(line, flush=True)

    plan = amp_plan(worlds, amp)
    runs = ", then at ".join(f"{world} rank(s) with --amp {mode}" for world, mode in plan)
    say(f"{EXERCISE}: checking {path.name} at {runs} (3 runs each: stopped, resumed, uninterrupted)")
    done: list[str] = []
    notes: list[str] = []
    for world, mode in plan:
        try:
            notes += check_world(
                path, probe, folder / f"ranks{world}-{mode}", world, mode, say, (envs or {}).get(world)
            )
        except Failed as failed:
            if done:
                failed.verdict.message += f" (It passed at {' and at '.join(done)} before.)"
            return failed.verdict
        done.append(f"{world} rank(s) with --amp {mode}")
    overflow = "fp16's overflow skipped on every rank, " if any(d.endswith("fp16") for d in done) else ""
    message = (
        f"your script passed every check at {' and at '.join(done)}: DDP, a shard per rank and a new order each "
        f"epoch, rank 0's log of the loss over all ranks, {overflow}rank 0's atomic "
        f"checkpoint, and a resume from step {STOP_AT} that ends as the uninterrupted run ends (bit for bit at 1 "
        f"or 2 ranks), its loader drawing each epoch's seed as that run drew it."
    )
    if notes:
        message += " Note: " + "; ".join(dict.fromkeys(notes)) + "."
    return Verdict(EXERCISE, True, PASSED, message, "", max(worlds))
