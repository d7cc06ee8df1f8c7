"""Exercises: the learner writes a lesson's key lines, the workbench runs them on live ranks and names the mistake."""

from __future__ import annotations

from ddp_helpers.rank.registry import UnknownExercise, all_exercises, get
from ddp_helpers.rank.spec import Exercise, Mistake

__all__ = ["Exercise", "Mistake", "UnknownExercise", "all_exercises", "get"]
