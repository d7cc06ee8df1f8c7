"""Every exercise, by id, in notebook order. Each notebook's exercises live in a module of their own.

No exercise module imports torch at its top: the catalogue loads in the kernel and the command line
within a second, so that bad input is refused before torch is imported or any rank starts.
"""

from __future__ import annotations

import importlib

from .spec import Exercise

# one module per notebook (a package where its exercises need a file each); each defines EXERCISES, a
# tuple in the order the notebook asks them
MODULES = (
    "nb00",
    "nb01",
    "nb02",
    "nb03",
    "nb04",
    "nb05",
    "nb06",
    "nb07",
    "nb08",
    "nb09",
)


def all_exercises() -> list[Exercise]:
    found: list[Exercise] = []
    for name in MODULES:
        found.extend(importlib.import_module(f"{__package__}.{name}").EXERCISES)
    return found


CAPSTONE = "10-capstone"  # notebook 10: a whole script, checked under torchrun (exercises/capstone/)
CAPSTONE_TITLE = "The whole DDP program, written by you, checked under torchrun"


def capstone_reference() -> str:
    """The project's reference capstone script (ddp_helpers/workers/capstone.py), as text."""
    from pathlib import Path

    return (Path(__file__).resolve().parent.parent / "workers" / "capstone.py").read_text()


def solution(exercise_id: str) -> str:
    """The reference answer of an exercise, or the capstone's whole reference script."""
    return capstone_reference() if exercise_id == CAPSTONE else get(exercise_id).reference


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
