"""Notebook 10's capstone check: the learner's whole script run under torchrun (stopped, resumed, uninterrupted)
and judged against a replay in one process.

    verdict = check_script("runs/capstone/my_ddp.py")  # 2 ranks with --amp fp16, then 3 with --amp bf16"""

from __future__ import annotations

import ast
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp_helpers.chapters.ch10_capstone.ch10_contract import AMP_MODES, EXERCISE, STOP_AT
from ddp_helpers.chapters.ch10_capstone.ch10_judge import Failed
from ddp_helpers.chapters.ch10_capstone.ch10_probe import PROBE
from ddp_helpers.chapters.ch10_capstone.ch10_world import check_world
from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.exercises.verdict import PASSED, Verdict

__all__ = ["EXERCISE", "amp_plan", "check_script"]

_checks = itertools.count()


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
    folder = (base / f"check-{os.getpid()}-{next(_checks)}-{time.time_ns() % 10**6}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
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
