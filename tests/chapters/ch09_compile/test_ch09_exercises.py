"""09-last-batch's move and marks, without ranks (tests/kernel runs the catalogued wrong answers on live ranks,
the mark made before the move among them): on a CPU the answer's `device` is cpu:0, so that the move copies
the loader's batch as a move to a GPU does, and a mark_dynamic made before the move is named for it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ddp_helpers.chapters.ch09_compile.ch09_exercises import LAST_BATCH, _last_batch_expected
from ddp_helpers.kernel.exercises.checker import judge


def test_the_move_to_a_cpu_device_with_an_index_copies_the_batch_as_a_move_to_a_gpu_does():
    """torch.device("cpu", 0) is not torch.device("cpu"): Tensor.to returns self only for the same device and
    dtype, so the batch moved to cpu:0 is a new tensor (torch 2.7 and 2.14), which a mark on the loader's
    tensor does not follow."""
    assert torch.device("cpu", 0) != torch.device("cpu")
    x = torch.zeros(4, 2)
    assert x.to(torch.device("cpu")) is x
    moved = x.to(torch.device("cpu", 0))
    assert moved is not x and moved.device.type == "cpu" and moved.data_ptr() != x.data_ptr()


def _results(world: int, compiles: int, marks: int, inputs_marked: list[bool]) -> list[dict[str, Any]]:
    right = _last_batch_expected(world)[0]
    return [
        {
            "rank": r,
            "error": None,
            **right,
            "compiles": compiles,
            "marks": marks,
            "inputs marked": inputs_marked,
        }
        for r in range(world)
    ]


@pytest.mark.parametrize(
    ("marks", "inputs_marked", "diagnosis"),
    [
        (2, [False, False], "09-last-batch-marked-before-move"),  # marked, but never the tensor the model got
        (0, [False, False], "09-last-batch-recompiled"),  # never marked
    ],
)
def test_a_second_compile_is_named_by_whether_the_model_got_a_marked_tensor(marks, inputs_marked, diagnosis):
    verdict = judge(LAST_BATCH, _results(2, 2, marks, inputs_marked))
    assert verdict.diagnosis == diagnosis, verdict.text()
    assert verdict.hint and verdict.hint != verdict.message
    assert judge(LAST_BATCH, _results(2, 1, 2, [True, True])).passed
