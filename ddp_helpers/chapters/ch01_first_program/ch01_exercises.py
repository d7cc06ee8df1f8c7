"""Notebook 01's exercises: make the single-device training DDP (01-convert), deal the shards of a resumed
run (01-shard), then make ranks that start apart agree, train and save (01-wrap).

Probe inputs make each mistake leave its own mark. The datasets record which indices each pass over a
loader drew. 01-convert's training is replayed here, in one process, as DDP computes it (every rank's
gradient on its own batch, averaged), so a right answer's weights are known without running it. 01-wrap's
model is a bias-free float64 Linear that sees a one-hot input per rank: after each SGD step with lr 1,
coordinate r of the weight has moved by minus rank r's share of the gradient, so an average, a sum, an
unshared gradient and gradients that pile up across steps all look different.
"""

from __future__ import annotations

from ddp_helpers.chapters.ch01_first_program.ch01_convert import CONVERT
from ddp_helpers.chapters.ch01_first_program.ch01_shard import SHARD
from ddp_helpers.chapters.ch01_first_program.ch01_shared import sampler_order
from ddp_helpers.chapters.ch01_first_program.ch01_wrap import WRAP

__all__ = ["EXERCISES", "sampler_order"]

EXERCISES = (CONVERT, SHARD, WRAP)
