"""Loopback nodes share the machine out: their own GPUs each (or gloo), and a fair share of cores."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest

from ddp_helpers.launcher.loopback import (
    ElasticNode,
    loopback_plan,
    start_elastic_node,
    visible_gpu_ids,
    wait_for_line,
)
from ddp_helpers.launcher.machine import free_port
from ddp_helpers.workers import worker_path


def test_without_gpus_every_node_runs_gloo_with_its_share_of_the_cores():
    plan = loopback_plan(2, 3, gpus=0, cpus=12, environ={})
    assert plan.backend == "auto"  # "auto" is gloo where there is no GPU
    assert plan.node_env == ({"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "2"})
    assert "on the CPU with gloo" in plan.line


def test_each_node_sees_gpus_of_its_own():
    plan = loopback_plan(2, 2, gpus=4, cpus=8, environ={})
    assert plan.backend == "auto"
    assert [env["CUDA_VISIBLE_DEVICES"] for env in plan.node_env] == ["0,1", "2,3"]
    assert "node 1: CUDA_VISIBLE_DEVICES=2,3" in plan.line


def test_gpu_slices_follow_an_existing_cuda_visible_devices():
    plan = loopback_plan(2, 1, gpus=2, cpus=2, environ={"CUDA_VISIBLE_DEVICES": "5, 7"})
    assert [env["CUDA_VISIBLE_DEVICES"] for env in plan.node_env] == ["5", "7"]
    assert visible_gpu_ids(2, {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}) == ["GPU-aa", "GPU-bb"]


@pytest.mark.parametrize("gpus", [1, 3])
def test_too_few_gpus_means_gloo_and_a_line_that_says_so(gpus):
    plan = loopback_plan(2, 2, gpus=gpus, cpus=1, environ={})
    assert plan.backend == "gloo"
    assert all("CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "1" for env in plan.node_env)
    assert f"need 4 GPUs and this machine has {gpus}" in plan.line


def test_refuses_an_empty_job():
    with pytest.raises(ValueError):
        loopback_plan(0, 1, gpus=0)


# ------------------------------------------------------------------ elastic nodes
ELASTIC_WITHIN_S = 180  # each wait: an agent and its workers import torch (tens of seconds on 2 busy cores)


def _starts(nodes):
    """Every `start:` line rank 0 wrote, in order: (world, step, restart)."""
    lines = [line for node in nodes for line in node.lines()]
    return [
        tuple(map(int, m.groups()))
        for m in map(re.compile(r"start: world (\d+), step (\d+), restart (\d+)").search, lines)
        if m
    ]


def _steps(nodes):
    return [
        tuple(map(int, m.groups()))
        for node in nodes
        for m in map(re.compile(r"\]: step (\d+): world (\d+)$").search, node.lines())
        if m
    ]


def test_a_wait_that_times_out_stops_the_nodes(tmp_path):
    log = tmp_path / "n.log"
    log.write_text("[rank0]: start: world 1, step 0, restart 0\n")
    node = ElasticNode("n", subprocess.Popen(["sleep", "60"], start_new_session=True), log)
    assert wait_for_line([node], r"start: world (\d+)", 1)[1] == "1"
    with pytest.raises(TimeoutError, match=r"no line matched 'done' within 0.5 s \(nodes stopped\)"):
        wait_for_line([node], "done", 0.5)
    assert node.process.poll() == -signal.SIGKILL  # nothing outlives the cell


def test_a_node_joins_a_running_job_and_a_killed_node_leaves_it(tmp_path):
    """--nnodes 1:2: one node trains alone, a second joins (every worker restarts in the larger world from
    the last saved step), then it is killed and the first re-rendezvouses alone and finishes."""
    nproc, hold, total = 1, 4, 14
    common = dict(
        nproc=nproc,
        min_nodes=1,
        max_nodes=2,
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        run_id="t",
        log_dir=tmp_path,
        max_restarts=2,
        rdzv_conf={"join_timeout": 120, "last_call_timeout": 1},
    )
    args = [
        "--steps",
        total,
        "--checkpoint-dir",
        tmp_path / "ckpt",
        "--step-s",
        0.2,
        "--hold-at-step",
        hold,
        "--hold-until-world",
        2 * nproc,
    ]
    a = start_elastic_node(worker_path("elastic_steps"), args, name="a", **common)
    b = None
    try:
        wait_for_line([a], rf"holding at step {hold}: world {nproc}\b", ELASTIC_WITHIN_S)
        b = start_elastic_node(worker_path("elastic_steps"), args, name="b", **common)
        wait_for_line([a, b], rf"step {hold + 2}: world {2 * nproc}$", ELASTIC_WITHIN_S)
        assert b.stop() == -signal.SIGKILL
        wait_for_line([a], r"done: step \d+", ELASTIC_WITHIN_S)
        assert a.process.wait(60) == 0, a.lines()[-20:]
    finally:
        for node in (a, b):
            if node is not None:
                node.stop()
    starts = _starts([a, b])
    # alone from 0; both from the step held at (a join is no restart); alone again after the kill (one restart)
    assert starts[:2] == [(nproc, 0, 0), (2 * nproc, hold, 0)], starts
    (world, resumed, restart) = starts[2]
    steps = _steps([a, b])
    before_kill = max(step for step, w in steps if w == 2 * nproc)
    assert (world, restart) == (nproc, 1) and before_kill <= resumed <= before_kill + 1, (starts, steps)
    # no step lost: every step from 1 to the end was taken, each by the world of its phase
    assert sorted({step for step, _ in steps}) == list(range(1, total + 1)), steps
    assert {w for step, w in steps if step <= hold} == {nproc} and {
        w for step, w in steps if step > resumed
    } == {nproc}
