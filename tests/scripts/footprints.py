"""tests/chapters/ch08_beyond_ddp/test_fsdp_footprint.py's job: each configuration's footprint, and meta-device init, on every rank.

torchrun --nproc-per-node 3 footprints.py OUT.json
"""

import argparse
import json
import sys
from typing import NotRequired, TypedDict

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ddp_helpers.chapters.ch08_beyond_ddp import fsdp_footprint, fsdp_meta
from ddp_helpers.rank import teardown


class Configuration(TypedDict):
    """fsdp_footprint.footprint's keywords that say how the model is split."""

    strategy: str
    precision: NotRequired[str]
    recompute: NotRequired[bool]


class Sizes(TypedDict):
    width: int
    depth: int
    batch: int


CONFIGURATIONS: list[Configuration] = [
    {"strategy": "ddp_default"},
    {"strategy": "zero1"},
    {"strategy": "zero2", "precision": "bf16", "recompute": True},
    {"strategy": "fsdp2"},
]

dist.init_process_group("gloo")
mesh, device = init_device_mesh("cpu", (dist.get_world_size(),)), torch.device("cpu")
sizes: Sizes = {"width": 40, "depth": 2, "batch": 4}  # 40 rows: uneven over 3 ranks (14, 14, 12)
result: dict[str, object] = {
    "footprints": [fsdp_footprint.footprint(mesh, device, **c, **sizes) for c in CONFIGURATIONS]
}
args = argparse.Namespace(features=32, width=40, depth=2, classes=10, seed=0)
result["meta_trace"] = fsdp_meta.meta_first(args, mesh, device)[0]
result["clipping"] = fsdp_meta.clipped_norm(args, mesh, device)
everyone: list[object] = [None] * dist.get_world_size()
dist.all_gather_object(everyone, result)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump({"configurations": CONFIGURATIONS, "sizes": sizes, "ranks": everyone}, out)
# as the bundled workers end: a plain destroy here once aborted rank 1 as it exited (gloo, torch 2.14.1)
teardown.destroy_process_group()
