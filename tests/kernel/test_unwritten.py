"""An answer not written yet is said to be so, with the TODOs still open, and no rank runs it: the unchanged
starter of every exercise, an empty cell, a `...` left in place. A cell pasted whole into the command line,
`%%exercise` line and all, is read as the notebook reads it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddp_helpers.errors import InvalidLaunchArguments
from ddp_helpers.kernel.exercises.checker import check, open_todos, unwritten_message
from ddp_helpers.kernel.exercises.exercise_cli import answer_of
from ddp_helpers.kernel.exercises.verdict import UNWRITTEN
from ddp_helpers.rank.registry import all_exercises, get


class NoRanks:
    """Stands where live ranks would be: an answer not written yet must never reach them."""

    world_size = 2

    def run(self, *args, **kwargs):
        raise AssertionError("an unwritten answer was sent to the ranks")


@pytest.mark.parametrize("exercise", [e.id for e in all_exercises()])
def test_the_unchanged_starter_of_every_exercise_says_it_is_not_written_yet(exercise):
    verdict = check(exercise, get(exercise).starter, NoRanks())
    assert (verdict.passed, verdict.diagnosis) == (False, UNWRITTEN), verdict.text()
    assert "starter as given" in verdict.message and "ellipsis" not in verdict.message, verdict.message
    assert verdict.text().startswith(f"✏️ {exercise}: not written yet"), verdict.text()


@pytest.mark.parametrize("answer", ["", "\n\n", "# my answer goes here\n", "...\n"])
def test_an_empty_answer_is_not_written_yet_and_repeats_the_task(answer):
    verdict = check("01-shard", answer, NoRanks())
    assert verdict.diagnosis == UNWRITTEN and get("01-shard").task in verdict.message, verdict.text()


def test_a_placeholder_left_in_a_written_answer_names_its_todo():
    answer = get("01-shard").starter.replace("sampler = ...", "sampler = DistributedSampler(dataset)")
    message = unwritten_message(get("01-shard"), answer)
    assert message == "`...` still stands where your code goes: line 4: one line, before the batches.", (
        message
    )


def test_a_numbered_todo_is_named_by_its_number_once():
    assert open_todos("rank = ...  # TODO 1: this process's rank\n") == [
        "line 1 (TODO 1): this process's rank"
    ]


def test_a_placeholder_without_a_todo_comment_shows_its_line():
    assert open_todos("x = 1\ny = f(...)\n") == ["line 2: y = f(...)"]


def test_an_ellipsis_in_a_subscript_is_code_not_a_placeholder():
    assert open_todos("last = x[..., -1]\n") == []
    assert unwritten_message(get("01-shard"), "last = x[..., -1]\n") is None


def test_a_written_answer_is_left_to_the_ranks():
    assert unwritten_message(get("01-shard"), get("01-shard").reference) is None


def test_a_cell_pasted_whole_loses_its_magic_line_and_must_name_the_same_exercise():
    cell = "%%exercise 01-shard\nsampler = DistributedSampler(dataset)\n"
    assert answer_of(cell, "01-shard") == "sampler = DistributedSampler(dataset)\n"
    assert answer_of("x = 1\n", "01-shard") == "x = 1\n"
    with pytest.raises(InvalidLaunchArguments, match="answer cell of 01-wrap, not of 01-shard"):
        answer_of("%%exercise 01-wrap\nx = 1\n", "01-shard")


def test_the_command_line_says_a_pasted_starter_cell_is_not_written_yet_without_starting_a_rank(tmp_path):
    answer = tmp_path / "answer.py"
    answer.write_text("%%exercise 01-shard\n" + get("01-shard").starter)
    out = subprocess.run(
        [sys.executable, "-m", "ddp_helpers", "exercises", "check", "01-shard", str(answer), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1 and verdict["diagnosis"] == UNWRITTEN, (out.stdout, out.stderr)
    assert "leading zeros" not in out.stdout + out.stderr
