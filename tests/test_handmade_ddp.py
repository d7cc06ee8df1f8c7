"""The hand-made DDPs against torch's, and the inside-DDP worker's profile and no_sync, on 2 gloo ranks."""

from __future__ import annotations

import json
import sys

import pytest

from ddp_helpers import launch, timeline
from ddp_helpers.workers import handmade_ddp, inside_ddp, worker_path

# 4 hidden layers of 64x64 (+ bias) and a 64x10 head: 10 parameter tensors, 4 of 16,640 bytes
TINY = ["--model", "mlp", "--width", "64", "--depth", "4", "--batch-size", "8"]
PARAM_TENSORS = 10
LAYER_BYTES = (64 * 64 + 64) * 4


def test_every_handmade_ddp_ends_with_ddps_weights(tmp_path):
    # a cap of one layer's bytes, filled in reverse order: the head and layer 4, then layers 3, 2, 1
    cap_mb = LAYER_BYTES / 2**20
    result = launch(worker_path("handmade_ddp"), *TINY, "--steps", 4, "--warmup-steps", 1,
                    "--bucket-cap-mb", cap_mb, nproc=2, run_dir=tmp_path, timeout=300)  # fmt: skip
    variants = result.summary["variants"]
    assert set(variants) == set(handmade_ddp.VARIANTS)
    for name, row in variants.items():
        assert row["equal_to_ddp"], (name, row)
        assert row["max_abs_diff_vs_ddp"] < 1e-5, (name, row)
        assert row["step_time_s"] > 0
    allreduces = {name: row["allreduces_per_step"] for name, row in variants.items()}
    assert allreduces == {
        "naive": PARAM_TENSORS,
        "flat": 1,
        "overlap": PARAM_TENSORS,
        "bucketed": 4,
        "ddp": None,
    }
    assert (result.summary["world_size"], result.summary["backend"]) == (2, "gloo")
    # every rank logged every step of every variant
    assert len(result.metrics) == 2 * 4 * len(handmade_ddp.VARIANTS)


def test_inside_ddp_profiles_and_counts_no_sync_allreduces(tmp_path):
    result = launch(worker_path("inside_ddp"), *TINY, "--experiments", "profile,no_sync", "--steps", 3,
                    "--warmup-steps", 1, "--profile-steps", 2, "--accumulate", 3, nproc=2, run_dir=tmp_path,
                    timeout=300)  # fmt: skip
    no_sync = result.summary["no_sync"]
    assert no_sync["equal"] and no_sync["max_abs_diff"] < 1e-5
    # the tiny model fits one 25 MiB bucket: one all-reduce per backward, or one per optimizer step
    assert no_sync["sync_every_micro_batch"]["allreduces_per_step"] == 3
    assert no_sync["no_sync"]["allreduces_per_step"] == 1
    assert result.summary["profile"]["allreduces"] == 2  # two profiled steps, one bucket each
    timelines = timeline.read_traces(tmp_path / "traces")
    assert [t.rank for t in timelines] == [0, 1]
    for t in timelines:
        assert len(t.steps) == 2 and t.phases["backward"] and t.compute
        assert len(t.allreduce) >= 1 and 0.0 <= t.overlap_fraction <= 1.0
    table = timeline.overlap_table(timelines)
    assert (table["allreduce_ms"] > 0).all()


@pytest.mark.parametrize(
    "module, argv",
    [(handmade_ddp, ["--variants", "naive,bogus"]), (handmade_ddp, ["--steps", "2", "--warmup-steps", "2"]),
     (inside_ddp, ["--experiments", "profile,bogus"]), (inside_ddp, ["--hooks", "fp8"])],
)  # fmt: skip
def test_bad_arguments_are_refused(module, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["worker.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args()
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


# ---------------------------------------------------------------------------- timeline, in-process


def test_interval_maths():
    assert timeline.union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert timeline.intersect([(0, 3), (5, 6)], [(2, 5.5)]) == [(2, 3), (5, 5.5)]
    assert timeline.subtract([(0, 10)], [(2, 3), (5, 6), (9, 12)]) == [(0, 2), (3, 5), (6, 9)]
    assert timeline.total([(0, 2), (1, 3)]) == 3


def _event(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_read_trace_on_a_gloo_shaped_trace(tmp_path):
    # one step: backward 100-500 us; the all-reduce runs 300-700 us on a gloo thread; the training
    # thread computes 100-400 and spends 400-450 handing the bucket to c10d
    events = [
        _event("step 0", 0, 1000, cat="user_annotation"),
        _event("backward", 100, 400, cat="user_annotation"),
        _event("autograd::engine::evaluate_function: AddmmBackward0", 100, 350),
        _event("c10d::allreduce_", 400, 50),
        _event("gloo:all_reduce", 300, 400, tid=7, cat="user_annotation"),
    ]
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = timeline.read_trace(path)
    assert t.rank == 3 and t.device == "cpu"
    assert t.compute == [(0.1, 0.4)]
    assert t.allreduce == [(0.3, 0.7)]
    assert t.overlap_fraction == pytest.approx(0.25)
    fig = timeline.plot_timelines([t])
    assert len(fig.axes) == 1


def test_read_trace_on_a_gpu_shaped_trace(tmp_path):
    # kernels decide on GPUs: a matmul kernel 100-400 us, an nccl all-reduce kernel 300-600 us on another
    # stream; the CPU-side ranges are earlier (launch latency) and do not count
    events = [
        _event("step 0", 0, 1000, cat="user_annotation"),
        _event("backward", 50, 300, cat="user_annotation"),
        _event("backward", 100, 400, tid=7, cat="gpu_user_annotation"),
        _event("aten::mm", 60, 20),
        _event("sm90_xmma_gemm_f32f32", 100, 300, tid=7, cat="kernel"),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 300, tid=8, cat="kernel"),
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    t = timeline.read_trace(path)
    assert t.device == "cuda"
    assert t.compute == [(0.1, 0.4)] and t.allreduce == [(0.3, 0.6)]
    assert t.phases["backward"] == [(0.1, 0.5)]
    assert t.overlap_fraction == pytest.approx(1 / 3)
