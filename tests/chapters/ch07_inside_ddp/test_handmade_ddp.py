"""The hand-made DDPs against torch's, and the inside-DDP worker's experiments, on 2 gloo ranks; the
wrappers' hooks, the unused-parameter error and the cost model in-process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_helpers import launch
from ddp_helpers.chapters.ch07_inside_ddp import ch07_cost_model as cost_model
from ddp_helpers.chapters.ch07_inside_ddp import ch07_timeline as timeline
from ddp_helpers.chapters.ch07_inside_ddp import handmade_ddp, inside_ddp
from ddp_helpers.workers import worker_path

# 4 hidden layers of 64x64 (+ bias) and a 64x10 head: 10 parameter tensors, 4 of 16,640 bytes
TINY = ["--model", "mlp", "--width", "64", "--depth", "4", "--batch-size", "8"]
PARAM_TENSORS = 10
LAYER_BYTES = (64 * 64 + 64) * 4
# with --batch-norm each hidden layer adds a BatchNorm1d: 2 more tensors of 256 bytes, 2 buffers of 64
BN_PARAM_TENSORS = PARAM_TENSORS + 2 * 4
BN_BUFFER_VALUES = 2 * 64 * 4


def test_every_handmade_ddp_rewrapped_ends_with_ddps_weights_and_buffers(tmp_path):
    # --rewrap: each model is wrapped, remove()d and wrapped again, as a rerun notebook cell does; without
    # remove() two sets of hooks divide twice and all-reduce twice, and the weights differ from DDP's.
    # --batch-norm: rank 1's running statistics equal DDP's only if rank 0's buffers are broadcast each forward.
    # A cap of one layer's bytes, filled in reverse order: the head with layer 4 (and its norm), then 3, 2, 1
    cap_mb = LAYER_BYTES / 2**20
    result = launch(
        worker_path("handmade_ddp"),
        *TINY,
        "--steps",
        4,
        "--warmup-steps",
        1,
        "--bucket-cap-mb",
        cap_mb,
        "--batch-norm",
        "--rewrap",
        nproc=2,
        run_dir=tmp_path,
        timeout=300,
    )
    variants = result.summary["variants"]
    assert set(variants) == set(handmade_ddp.VARIANTS)
    for name, row in variants.items():
        assert row["equal_to_ddp"], (name, row)
        assert row["max_abs_diff_vs_ddp"] < 1e-5, (name, row)
        assert row["buffer_max_abs_diff_vs_ddp"] < 1e-5, (name, row)
        assert row["step_time_s"] > 0
    allreduces = {name: row["allreduces_per_step"] for name, row in variants.items()}
    assert allreduces == {
        "naive": BN_PARAM_TENSORS,
        "flat": 1,
        "overlap": BN_PARAM_TENSORS,
        "bucketed": 4,
        "ddp": None,
    }
    assert result.summary["rewrap"] and result.summary["buffer_values"] == BN_BUFFER_VALUES
    assert (result.summary["world_size"], result.summary["backend"]) == (2, "gloo")
    # every rank logged every step of every variant
    assert len(result.metrics) == 2 * 4 * len(handmade_ddp.VARIANTS)


def test_inside_ddp_experiments(tmp_path):
    result = launch(
        worker_path("inside_ddp"),
        *TINY,
        "--experiments",
        "profile,no_sync,allreduce,options",
        "--steps",
        3,
        "--warmup-steps",
        1,
        "--profile-steps",
        2,
        "--accumulate",
        3,
        "--allreduce-bytes",
        "1024,65536,1048576",
        "--repeats",
        3,
        nproc=2,
        run_dir=tmp_path,
        timeout=300,
    )
    no_sync = result.summary["no_sync"]
    assert no_sync["equal"] and no_sync["max_abs_diff"] < 1e-5
    # the tiny model fits one 25 MiB bucket: one all-reduce per backward, or one per optimizer step
    assert no_sync["sync_every_micro_batch"]["allreduces_per_step"] == 3
    assert no_sync["no_sync"]["allreduces_per_step"] == 1
    profile = result.summary["profile"]
    assert (
        profile["allreduces"] == 2 and profile["one_bucket"]["allreduces"] == 2
    )  # two steps, one bucket each
    for directory in ("traces", "traces_one_bucket"):
        timelines = timeline.read_traces(tmp_path / directory)
        assert [t.rank for t in timelines] == [0, 1]
        for t in timelines:
            assert len(t.steps) == 2 and t.phases["backward"] and t.compute
            assert len(t.allreduce) >= 1 and 0.0 <= t.overlap_fraction <= 1.0
        assert (timeline.overlap_table(timelines)["allreduce_ms"] > 0).all()
    rows = result.summary["allreduce"]["rows"]
    assert [row["bytes"] for row in rows] == [1024, 65536, 1048576]
    assert result.summary["allreduce"]["iters"] == 3  # each time: three back to back, averaged
    assert all(row["seconds"] > 0 for row in rows)
    # gradient_as_bucket_view: the measured blocks behind .grad and the buckets hold one copy fewer
    options = result.summary["options"]
    default, view = options["default"], options["gradient_as_bucket_view"]
    grad_bytes = (4 * LAYER_BYTES) + (64 * 10 + 10) * 4
    assert default["grad_bytes"] == view["grad_bytes"] == grad_bytes
    assert not default["grads_are_bucket_views"] and view["grads_are_bucket_views"]
    assert default["gradient_memory_bytes"] - view["gradient_memory_bytes"] == grad_bytes
    assert default["grad_storages"] == PARAM_TENSORS and view["grad_storages"] == view["bucket_storages"]


@pytest.mark.parametrize(
    "module, argv",
    [
        (handmade_ddp, ["--variants", "naive,bogus"]),
        (handmade_ddp, ["--steps", "2", "--warmup-steps", "2"]),
        (inside_ddp, ["--experiments", "profile,bogus"]),
        (inside_ddp, ["--allreduce-bytes", "2"]),
        (inside_ddp, ["--repeats", "0"]),
        (inside_ddp, ["--iters", "0"]),
    ],
)
def test_bad_arguments_are_refused(module, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["worker.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args()
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


# ---------------------------------------------------------------------------- timeline, in-process


def test_interval_maths():
    assert timeline.union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    # a span is cut at the end of the window it starts in; one that starts in none is dropped
    assert timeline.clip_to_containing([(1, 9), (12, 13), (30, 31)], [(0, 5), (10, 20)]) == [(1, 5), (12, 13)]
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
    assert t.allreduce_in_backward == [(0.3, 0.5)]  # cut where backward returned
    assert t.hidden_ms == pytest.approx(0.1)
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


# ---------------------------------------------------------------------------- hooks and errors, one rank


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank in this process (an all-reduce of one rank is the identity)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _backward(wrapper, net) -> None:
    wrapper(torch.randn(3, 4)).sum().backward()
    wrapper.finish_gradient_synchronization()
    net.zero_grad(set_to_none=True)


@pytest.mark.parametrize("cls", [handmade_ddp.OverlapDDP, handmade_ddp.BucketedDDP])
def test_remove_takes_the_hooks_off_and_a_rewrap_sends_once(one_rank_group, cls):
    net = _net()
    stale = cls(net)
    stale.remove()
    with cls(net) as fresh:
        _backward(fresh, net)
        assert fresh.allreduces == (4 if cls is handmade_ddp.OverlapDDP else 1)
    assert not fresh.hooks  # the with block removed them
    net(torch.randn(3, 4)).sum().backward()  # no wrapper's hook is left on the parameters: nothing sent
    for wrapper in (stale, fresh):
        assert not getattr(wrapper, "handles", []) and not getattr(wrapper, "in_flight", [])


def test_without_remove_a_rewrap_stacks_the_hooks(one_rank_group):
    net = _net()
    first, second = handmade_ddp.OverlapDDP(net), handmade_ddp.OverlapDDP(net)
    second(torch.randn(3, 4)).sum().backward()
    assert len(first.handles) == len(second.handles) == 4  # two all-reduces per gradient in flight
    first.finish_gradient_synchronization()
    second.finish_gradient_synchronization()


def test_bucketed_ddp_raises_on_a_parameter_without_gradient(one_rank_group):
    net = _net()
    unused = nn.Linear(2, 2)  # registered, never called in forward
    model = nn.ModuleDict({"net": net, "unused": unused})
    wrapper = handmade_ddp.BucketedDDP(model, bucket_cap_mb=1e-6)  # one bucket per tensor
    assert isinstance(wrapper.module, nn.ModuleDict)
    wrapper.module["net"](torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"never filled.*find_unused_parameters"):
        wrapper.finish_gradient_synchronization()


# ---------------------------------------------------------------------------- cost model


def test_fit_alpha_beta_recovers_a_line_and_scores_a_bad_one():
    sizes = [4**k for k in range(6, 13)]
    fit = cost_model.fit_alpha_beta(sizes, [50e-6 + n * 1e-9 for n in sizes])
    assert fit.alpha_s == pytest.approx(50e-6) and fit.beta_s_per_byte == pytest.approx(1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.max_relative_residual < 1e-9
    flat_noise = cost_model.fit_alpha_beta(sizes, [1e-3, 5e-3, 1e-3, 5e-3, 1e-3, 5e-3, 1e-3])
    assert flat_noise.r2 < 0.5  # no line through noise: the notebook's R2 bound would fail
    with pytest.raises(ValueError):
        cost_model.fit_alpha_beta([1, 2], [1.0, 2.0])


@pytest.mark.parametrize("cap", [100, 16_640, 40_000, 10**9])
def test_bucket_sizes_follow_ddps_own_assignment(cap):
    # the parameters of TINY in gradient-ready order; torch's function gives DDP's initial layout
    tensors = [torch.empty(n) for n in [10, 640] + [64, 4096] * 4]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, [cap])
    expected = [sum(tensors[i].numel() * 4 for i in bucket) for bucket in indices]
    assert cost_model.bucket_sizes([t.numel() * 4 for t in tensors], cap) == expected


def test_exposed_time():
    fit = cost_model.AlphaBeta(alpha_s=1.0, beta_s_per_byte=0.5, r2=1.0, max_relative_residual=0.0)
    # backward 8 s over 8 bytes; buckets of 4 ready at 4 s and 8 s, each taking 1 + 2 = 3 s:
    # the first runs 4-7, the second 8-11: 3 s exposed
    assert cost_model.exposed_comm_s([4, 4], backward_s=8.0, fit=fit) == pytest.approx(3.0)
    # one bucket: ready at 8 s, runs 8-13: 5 s exposed
    assert cost_model.exposed_comm_s([8], backward_s=8.0, fit=fit) == pytest.approx(5.0)
    cap, exposed = cost_model.best_cap([4, 4], backward_s=8.0, fit=fit)
    assert exposed == pytest.approx(3.0) and 4 <= cap < 8  # two buckets, the largest cap that gives them


# ---------------------------------------------------------------------------- notebook 07's live cells


def test_notebook_07_live_check_holds_however_often_its_cells_rerun():
    """Issue 24: rerunning the sync cell (or exercise 2's BucketedDDP) must not break the check cell."""
    import nbformat

    from ddp_helpers import check as check_claim
    from ddp_helpers.kernel.live.ranks import start_ranks

    notebook = nbformat.read(Path(__file__).resolve().parents[3] / "notebooks" / "07_inside_ddp.ipynb", 4)
    setup, synced = [c.source.split("\n", 1)[1] for c in notebook.cells if c.source.startswith("%%ranks")]
    check = next(c.source for c in notebook.cells if c.source.startswith("live = ranks"))
    exercise_2 = (
        "local_grad, synced_grad, weights, ddp_net = "
        "synced_step(lambda net: BucketedDDP(net, bucket_cap_mb=0.0001))"
    )
    live = start_ranks(2, backend="gloo", show_ranks=None)
    try:
        live.run(setup)
        for cell in (synced, synced, exercise_2, exercise_2):
            live.run(cell)
            exec(check, {"ranks": live, "torch": torch, "check": check_claim})  # ClaimFailed if one fails
    finally:
        live.shutdown()
