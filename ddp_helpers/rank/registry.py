"""Every exercise, by id, in notebook order. No exercise module imports torch at its top: bad input is
refused before torch is imported or any rank starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_helpers.rank.spec import Exercise


def all_exercises() -> list[Exercise]:
    """Every exercise, in notebook order: each chapter's chNN_exercises.EXERCISES, in the order it asks them."""
    from ddp_helpers.chapters.ch00_environment import ch00_exercises
    from ddp_helpers.chapters.ch01_first_program import ch01_exercises
    from ddp_helpers.chapters.ch02_single_dp_ddp import ch02_exercises
    from ddp_helpers.chapters.ch03_mixed_precision import ch03_exercises
    from ddp_helpers.chapters.ch04_checkpointing import ch04_exercises
    from ddp_helpers.chapters.ch05_debugging import ch05_exercises
    from ddp_helpers.chapters.ch06_scaling_out import ch06_exercises
    from ddp_helpers.chapters.ch07_inside_ddp import ch07_exercises
    from ddp_helpers.chapters.ch08_beyond_ddp import ch08_exercises
    from ddp_helpers.chapters.ch09_compile import ch09_exercises

    chapters = [ch00_exercises, ch01_exercises, ch02_exercises, ch03_exercises, ch04_exercises]
    chapters += [ch05_exercises, ch06_exercises, ch07_exercises, ch08_exercises, ch09_exercises]
    return [exercise for chapter in chapters for exercise in chapter.EXERCISES]


# notebook 10: a whole script, checked under torchrun (ddp_helpers/chapters/ch10_capstone/)
CAPSTONE = "10-capstone"
CAPSTONE_TITLE = "The whole DDP program, written by you, checked under torchrun"
CAPSTONE_SCRIPT = Path(__file__).resolve().parents[1] / "chapters" / "ch10_capstone" / "capstone.py"


def catalogue() -> list[dict[str, Any]]:
    """Every exercise's id, notebook, title and the capstone lines it covers; the capstone last."""
    rows = [
        {"id": e.id, "notebook": e.notebook, "title": e.title, "covers": list(e.covers)}
        for e in all_exercises()
    ]
    return rows + [{"id": CAPSTONE, "notebook": "10", "title": CAPSTONE_TITLE, "covers": []}]


def solution(exercise_id: str) -> str:
    """The reference answer of an exercise, or the capstone's whole reference script."""
    return CAPSTONE_SCRIPT.read_text() if exercise_id == CAPSTONE else get(exercise_id).reference


class UnknownExercise(KeyError):
    """No exercise has this id; the message lists those that do."""

    def __str__(self) -> str:
        return str(self.args[0])


def get(exercise_id: str) -> Exercise:
    exercises = all_exercises()
    for exercise in exercises:
        if exercise.id == exercise_id:
            return exercise
    known = ", ".join(e.id for e in exercises)
    if exercise_id == CAPSTONE:
        raise UnknownExercise(f"{CAPSTONE} is a whole script: check it with check-script (or notebook 10)")
    raise UnknownExercise(f"no exercise {exercise_id!r}; the exercises are: {known}, and {CAPSTONE}")
