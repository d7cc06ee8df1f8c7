"""Notebook 08's calculator: known values worked by hand, and bad input refused with a clear error.

The model: 32 features, two 48-wide blocks, 10 classes. Its parameters: embed 48x32 + 48 = 1,584;
each block 48x48 + 48 = 2,352; head 10x48 + 10 = 490; 6,778 in all, in 8 tensors.
"""

from __future__ import annotations

import math
from typing import TypedDict

import pytest

from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import (
    Setup,
    block_mlp_shapes,
    disagreements,
    padded_numel,
    predict,
    ring_bytes_per_rank,
    shard_numel,
    zero1_owners,
)

P, TENSORS = 6_778, 8


class Size(TypedDict):
    """Setup's model and batch fields, typed so that `**SMALL` checks against Setup's."""

    width: int
    depth: int
    batch: int


SMALL: Size = {"width": 48, "depth": 2, "batch": 4}


def test_the_shapes_are_block_mlps():
    shapes = block_mlp_shapes(32, 48, 2, 10)
    assert shapes[:2] == [(48, 32), (48,)] and shapes[-2:] == [(10, 48), (10,)]
    assert len(shapes) == TENSORS and sum(math.prod(s) for s in shapes) == P


def test_shards_split_rows_as_torch_chunk_does():
    assert [shard_numel((10, 48), r, 8) for r in range(8)] == [96] * 5 + [0] * 3  # 2 rows each, 5 ranks
    assert [shard_numel((10,), r, 3) for r in range(3)] == [4, 4, 2]
    assert padded_numel((10, 48), 3) == 12 * 48 and padded_numel((48,), 2) == 48


def test_zero1_deals_largest_first_to_the_emptiest_rank():
    # sorted 9 (1), 9 (3), 5 (0), 1 (2): ties keep their order, and the lowest of the emptiest ranks wins
    assert zero1_owners([5, 9, 1, 9], 2) == [[1, 0], [3, 2]]
    assert zero1_owners([3], 3) == [[0], [], []]


def test_ddp_holds_16_bytes_per_param_and_20_with_its_default_buckets():
    ddp = predict(Setup(world=2, **SMALL))
    assert [r["parameters"] + r["gradients"] + r["optimizer"] for r in ddp] == [16 * P + 4 * TENSORS] * 2
    default = predict(Setup(world=2, strategy="ddp_default", **SMALL))[0]
    assert default["gradients"] == 8 * P
    assert ddp[0]["sent"] == {"all_reduce": 4 * P, "all_gather": 0, "reduce_scatter": 0, "broadcast": 0}


def test_zero1_splits_adams_state_and_broadcasts_the_weights():
    ranks = predict(Setup(world=2, strategy="zero1", **SMALL))
    # 2,304 (block 0), 2,304 (block 1), 1,536 (embed), 480 (head), 48 x 3, 10: rank 0 takes block 0 and
    # embed (3,840 elements), rank 1 block 1 and the rest (2,938), as measured on 2 and on 3 ranks
    assert [r["optimizer"] for r in ranks] == [8 * 3840 + 4 * 2, 8 * 2938 + 4 * 6]
    assert ranks[0]["sent"]["broadcast"] == 4 * P == ranks[0]["sent"]["all_reduce"]


def test_zero2_keeps_every_unit_gathered_and_gathers_once():
    zero2 = predict(Setup(world=2, strategy="zero2", **SMALL))[0]
    assert zero2["parameters"] == 4 * P // 2 + 4 * P  # its fp32 shard, and every unit still gathered
    assert zero2["gradients"] == 4 * P // 2 and zero2["optimizer"] == 8 * P // 2 + 4 * TENSORS
    assert zero2["sent"]["all_gather"] == 4 * P == zero2["sent"]["reduce_scatter"]


def test_fsdp2_regathers_the_blocks_and_keeps_only_the_root_gathered():
    fsdp2 = predict(Setup(world=2, strategy="fsdp2", **SMALL))[0]
    root = 1584 + 490
    assert fsdp2["parameters"] == 4 * P // 2 + 4 * root
    assert fsdp2["sent"]["all_gather"] == 4 * (P + 2 * 2352)  # the blocks twice, the root once


def test_bf16_policy_halves_the_gathered_weights_and_activations_but_not_the_reduce():
    fp32 = predict(Setup(world=2, strategy="fsdp2", **SMALL))[0]
    bf16 = predict(Setup(world=2, strategy="fsdp2", precision="bf16", **SMALL))[0]
    assert fp32["parameters"] - bf16["parameters"] == 2 * (1584 + 490)
    assert bf16["sent"]["all_gather"] * 2 == fp32["sent"]["all_gather"]
    assert bf16["sent"]["reduce_scatter"] == fp32["sent"]["reduce_scatter"]
    assert bf16["activations"] == 4 * (2 * 282 + 8) + 2  # the int64 target stays 8 bytes


def test_activations_worked_by_hand_and_with_recomputation():
    # per sample: 32 + 2 blocks x 2 x 48 + 48 + 10 = 282 floats, + an int64 target; + total_weight once
    assert predict(Setup(world=1, **SMALL))[0]["activations"] == 4 * (4 * 282 + 8) + 4
    # recomputation keeps each block's input only: 32 + 2 x 48 + 48 + 10 = 186 floats
    assert predict(Setup(world=1, recompute=True, **SMALL))[0]["activations"] == 4 * (4 * 186 + 8) + 4


def test_ring_bytes():
    assert ring_bytes_per_rank({"all_reduce": 100}, 4) == 150
    assert ring_bytes_per_rank({"all_gather": 100, "reduce_scatter": 100}, 2) == 100
    assert ring_bytes_per_rank({"all_reduce": 100}, 1) == 0


def test_disagreements_name_the_rank_and_the_part():
    want = predict(Setup(world=2, **SMALL))
    got = [dict(r, sent=dict(r["sent"])) for r in want]
    assert disagreements(want, got) == []
    got[1]["gradients"] *= 2
    assert disagreements(want, got) == [f"rank 1 gradients: predicted {4 * P:,}, measured {8 * P:,}"]
    assert disagreements(want, got, rtol=1.0) == []
    assert disagreements(want, got[:1]) == ["1 ranks measured, 2 predicted"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 0}, "width must be a positive int"),
        ({"batch": 2.5}, "batch must be a positive int"),
        ({"world": True}, "world must be a positive int"),
        ({"strategy": "zero3"}, "strategy must be one of"),
        ({"precision": "fp16"}, "precision must be one of"),
        ({"strategy": "ddp", "precision": "bf16"}, "bf16 here is FSDP2's MixedPrecisionPolicy"),
    ],
)
def test_bad_setups_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        Setup(**{**SMALL, "world": 2, **change})
