"""Loopback nodes: this machine's GPU ids, and elastic nodes that never outlive a failed wait."""

from __future__ import annotations

import signal
import subprocess

import pytest

from ddp_helpers.chapters.ch06_scaling_out.ch06_loopback import ElasticNode, wait_for_line
from ddp_helpers.kernel.launcher.machine import visible_gpu_ids


def test_gpu_ids_follow_an_existing_cuda_visible_devices():
    assert visible_gpu_ids(2, {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}) == ["GPU-aa", "GPU-bb"]
    assert visible_gpu_ids(2, {}) == ["0", "1"]


# ------------------------------------------------------------------ elastic nodes
def test_a_wait_that_times_out_stops_the_nodes(tmp_path):
    log = tmp_path / "n.log"
    log.write_text("[rank0]: start: world 1, step 0, restart 0\n")
    node = ElasticNode("n", subprocess.Popen(["sleep", "60"], start_new_session=True), log)
    assert wait_for_line([node], r"start: world (\d+)", 1)[1] == "1"
    with pytest.raises(TimeoutError, match=r"no line matched 'done' within 0.5 s \(nodes stopped\)"):
        wait_for_line([node], "done", 0.5)
    assert node.process.poll() == -signal.SIGKILL  # nothing outlives the cell


# A node joining a running job (--nnodes 1:2) and a killed node leaving it: notebook 06 runs that demo
# and asserts each step (the world sizes, the step resumed at, no step lost), in make test and on each shape.
