"""The calculator's predictions against real ranks, outside the notebook: 3 gloo ranks (uneven rows),
one job. Notebook 08 asserts the same for its own sizes, at 2 ranks by default."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddp_helpers import launch
from ddp_helpers.chapters.ch08_beyond_ddp.ch08_memory_calculator import (
    Setup,
    block_mlp_shapes,
    disagreements,
    predict,
    shard_numel,
)

pytestmark = pytest.mark.xdist_group("test_fsdp_footprint")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "footprints.py"
WORLD = 3


@pytest.fixture(scope="module")
def footprints(tmp_path_factory):
    # its own run folder: this fixture runs before conftest sets DDP_HELPERS_RUNS_DIR for a test, and the
    # default would be the repo's runs/
    run_dir = tmp_path_factory.mktemp("footprints")
    out = run_dir / "out.json"
    launch(SCRIPT, out, nproc=WORLD, run_dir=run_dir, timeout=300, show_ranks="none")
    return json.loads(out.read_text())


def test_every_configuration_is_predicted_to_the_byte(footprints):
    for index, options in enumerate(footprints["configurations"]):
        measured = [rank["footprints"][index] for rank in footprints["ranks"]]
        predicted = predict(Setup(world=WORLD, **footprints["sizes"], **options))
        assert disagreements(predicted, measured) == [], options


def test_meta_init_holds_only_the_shards(footprints):
    shapes = block_mlp_shapes(32, 40, 2, 10)
    for rank, row in enumerate(footprints["ranks"]):
        own = 4 * sum(shard_numel(s, rank, WORLD) for s in shapes)
        assert [tuple(step) for step in row["meta_trace"]] == [
            ("built on meta", 0),
            ("fully_shard", 0),
            ("to_empty", own),
            ("reset_parameters", own),
        ]


def test_clip_grad_norm_over_shards_is_the_full_norm(footprints):
    for row in footprints["ranks"]:
        clip = row["clipping"]
        assert clip["norm_type"] == "DTensor" and math.isclose(clip["norm"], clip["expected"], rel_tol=1e-5)
