"""Judging one check: what the ranks did against what a right script does; a known mistake by its signature."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ddp_helpers.chapters.ch10_capstone.ch10_contract import EXERCISE, HINTS, RUN_TIMEOUT_S
from ddp_helpers.chapters.ch10_capstone.ch10_runs import Run
from ddp_helpers.kernel.exercises.verdict import HUNG, RAISED, UNKNOWN, Verdict
from ddp_helpers.rank.spec import differences


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
