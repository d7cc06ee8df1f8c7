"""Notebook 01's helpers (ddp_helpers/chapters/ch01_first_program/ch01_first_program.py): what they read from the scripts' output."""

from __future__ import annotations

import torch

from ddp_helpers.chapters.ch01_first_program import ch01_first_program as lab

DDP_OUTPUT = (
    "rank 0 drew samples [684, 1939, 327, 913] first\n"
    "epoch 0: loss 0.1237 (mean over 2048 samples)\n"
    "rank 0 drew samples [1061, 1250, 707, 697] first\n"
    "epoch 1: loss 0.0113 (mean over 2048 samples)\n"
    "saved runs/ddp.pt\n"
)


def test_the_printed_losses_counts_and_first_samples_are_read_back():
    assert lab.losses(DDP_OUTPUT) == [0.1237, 0.0113]
    assert lab.samples_counted(DDP_OUTPUT) == [2048, 2048]
    assert lab.first_drawn(DDP_OUTPUT) == [[684, 1939, 327, 913], [1061, 1250, 707, 697]]
    assert lab.losses("saved runs/ddp.pt\n") == []


def test_equal_lists_of_tensors_compare_equal_and_their_mean_is_taken_per_tensor():
    a = [torch.ones(2), torch.zeros(3)]
    b = [torch.ones(2), torch.full((3,), 2.0)]
    assert lab.all_equal([a, [t.clone() for t in a]]) and not lab.all_equal([a, b])
    assert lab.checksum(a) == 2.0 and lab.checksum(b) == 8.0
    mean = lab.mean_over_ranks([a, b])
    assert torch.equal(mean[1], torch.ones(3)) and lab.worst_gap(mean, a) == 1.0
