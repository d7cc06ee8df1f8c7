"""ddp_helpers/workers/train.py: its main() in this process (a world of one), one run as plain python, and torchrun
through launch() or on live ranks."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from ddp_helpers import WorkerFailed, launch, read_metrics, read_summary
from ddp_helpers.workers import train, worker_path
from ddp_helpers.workers.train import RESUME_PARTS, parse_args

# Its module-scoped fixture starts a job: with `--dist loadgroup` one xdist worker runs the whole
# module, so the job starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_train_worker")

TRAIN = str(worker_path("train"))
TINY = ["--num-samples", "256", "--hidden", "32", "--log-every", "1"]
SUMMARY_KEYS = {
    "mode",
    "world_size",
    "backend",
    "device",
    "amp",
    "samples_per_s",
    "peak_mem_bytes",
    "final_loss",
    "torch_version",
}
METRIC_KEYS = {"rank", "step", "epoch", "loss", "samples", "step_time_s", "time"}


def run_plain(*args, run_dir):
    """The worker as a learner runs it, `python train.py ...`: a new interpreter, its exit code and output."""
    return subprocess.run(
        [sys.executable, TRAIN, *map(str, args), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_here(*args, run_dir):
    """train.main(argv) in this process, a world of one as under plain python, without a new interpreter's
    torch import: what it printed. The global state main() sets is put back: the random generators, the
    deterministic mode and cuDNN's benchmark flag. (Unwrapped: not @record, which would point this
    process's faulthandler at pytest's capture.)"""
    printed = io.StringIO()
    deterministic, benchmark = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    try:
        with torch.random.fork_rng(), contextlib.redirect_stdout(printed):
            inspect.unwrap(train.main)([*map(str, args), "--run-dir", str(run_dir)])
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark = benchmark
    return printed.getvalue()


def run_here_fixture(*args):
    """A module-scoped run of main() in this process, shared by the tests that read it: its run dir and output."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory):
        run_dir = tmp_path_factory.mktemp("plain")
        return run_dir, run_here(*args, run_dir=run_dir)

    return fixture


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Two gloo ranks that stay up (live ranks, as notebooks 02 and 04 use them). The tests on them check
    what train.py computes, not how it starts: each runs a fresh main(argv) there, for one job's start-up."""
    from ddp_helpers.kernel.live.ranks import start_ranks

    ranks = start_ranks(2, backend="gloo", show_ranks="none", run_dir=tmp_path_factory.mktemp("live"))
    ranks.import_file(TRAIN, "train")
    yield ranks
    ranks.shutdown()


def train_on(ranks, *args, run_dir):
    """train.py's main(argv) on the live ranks, writing into run_dir: its metrics and summary."""
    ranks.run(f"train.main({[str(a) for a in (*args, '--run-dir', run_dir)]!r})")
    return SimpleNamespace(metrics=read_metrics(run_dir), summary=read_summary(run_dir))


single_run = run_here_fixture(*TINY, "--steps", 6, "--tensorboard")  # fp32, one process
dp_run = run_here_fixture(*TINY, "--mode", "dp", "--steps", 3)


def test_single_process_writes_metrics_and_summary(single_run):
    tmp_path, _ = single_run
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert (summary["mode"], summary["world_size"], summary["steps"]) == ("single", 1, 6)
    assert summary["samples_per_s"] > 0 and summary["peak_mem_kind"] == "cpu_peak_rss"
    lines = [json.loads(line) for line in (tmp_path / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 7))
    assert all(METRIC_KEYS <= r.keys() for r in lines)
    # --tensorboard: loss, lr and throughput scalars, one per logged step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"loss", "lr", "samples_per_s"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("loss")] == list(range(1, 7))


def test_ddp_two_ranks_through_launch(tmp_path):
    result = launch(TRAIN, *TINY, "--steps", 6, nproc=2, run_dir=tmp_path)
    assert (result.summary["mode"], result.summary["world_size"], result.summary["backend"]) == (
        "ddp",
        2,
        "gloo",
    )
    assert result.summary["global_batch_size"] == 64
    assert sorted(result.metrics["rank"].unique()) == [0, 1]
    rank0 = result.metrics[result.metrics["rank"] == 0]
    assert rank0["samples"].tolist() == [32 * s for s in range(1, 7)]
    assert rank0["global_samples"].tolist() == [64 * s for s in range(1, 7)]
    assert math.isfinite(result.summary["final_loss"])
    # psutil sampled each rank while it ran (start-up included: importing torch takes seconds)
    assert set(result.resources["rank"].dropna().astype(int)) == {0, 1}
    assert (result.resources["cpu_percent"] >= 0).all()


def test_injected_fault_names_the_rank(tmp_path):
    with pytest.raises(WorkerFailed) as info:
        launch(TRAIN, *TINY, "--steps", 6, "--fail-at-step", 3, "--fail-rank", 1, nproc=2, run_dir=tmp_path)
    assert (
        str(info.value).splitlines()[0] == "rank 1 failed: RuntimeError: injected fault on rank 1 at step 3"
    )
    assert "raise RuntimeError" in info.value.traceback


@pytest.mark.heavy  # DataParallel trains in this process: 9 s
def test_dataparallel_on_cpu_says_it_runs_unsplit(dp_run):
    tmp_path, printed = dp_run
    if not torch.cuda.is_available():
        assert "runs the module on one device" in printed
    assert json.loads((tmp_path / "summary.json").read_text())["mode"] == "dp"


def test_bf16_on_cpu_gives_finite_losses(tmp_path):
    run_here(*TINY, "--amp", "bf16", "--steps", 4, run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["amp"] == "bf16" and math.isfinite(summary["final_loss"])
    # the AMP fields: no scaler with bf16, and memory labelled for what it measures
    assert summary["grad_scale"] is None and summary["skipped_steps"] == 0
    assert summary["peak_mem_kind"] == (
        "cuda_max_memory_allocated" if torch.cuda.is_available() else "cpu_peak_rss"
    )


@pytest.mark.heavy  # a ResNet-18 in this process: 15 s
def test_digits_dataset_and_resnet18(tmp_path):
    args = ["--model", "resnet18", "--dataset", "digits", "--batch-size", 16, "--steps", 2, "--log-every", 1]
    run_here(*args, run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["model"], summary["dataset"]) == ("resnet18", "digits")
    steps = read_metrics(tmp_path)
    # two optimizer steps of 16 digits each (samples: the count so far), with a loss a 10-class model
    # starts near, ln(10) = 2.3
    assert list(steps["step"]) == [1, 2] and list(steps["samples"]) == [16, 32], steps
    assert all(0.5 < loss < 10 for loss in steps["loss"]), steps


def test_a_bad_flag_ends_the_script_with_argparses_exit_code(tmp_path):
    proc = run_plain("--mode", "ddp", run_dir=tmp_path)  # as a learner runs it: python train.py ...
    assert proc.returncode == 2 and "needs torchrun" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "ddp"], "needs torchrun"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--model", "vgg"], "invalid choice"),
        (["--resume"], "--resume needs --checkpoint-dir"),
    ],
)
def test_bad_flags_are_refused(args, message, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as info:
        parse_args(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--stop-at-step"])
def test_a_count_of_zero_is_refused_not_read_as_unset(flag, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as info:
        parse_args([flag, "0"])
    assert info.value.code == 2
    assert f"{flag} must be >= 1" in capsys.readouterr().err


def test_resume_ignore_names_each_part_on_its_own(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    args = parse_args(["--checkpoint-dir", "c", "--resume", "--resume-ignore", "scheduler", "scaler"])
    assert args.resume_ignore == ["scheduler", "scaler"]
    assert set(RESUME_PARTS) == {"rng", "optimizer", "scheduler", "scaler"}


@pytest.mark.gpu
def test_fp16_with_grad_scaler_on_gpu(tmp_path):
    result = launch(TRAIN, *TINY, "--amp", "fp16", "--steps", 6, nproc=1, run_dir=tmp_path)
    assert result.summary["grad_scale"] is not None
    assert math.isfinite(result.summary["final_loss"])


def test_tensorboard_flag_says_how_to_install_it_when_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        run_here("--tensorboard", run_dir=tmp_path)
    assert exit_info.value.code == 2
    assert "pip install tensorboard" in capsys.readouterr().err


def test_eval_accuracy_is_exact_over_an_uneven_test_split(two_ranks, tmp_path):
    # digits' test split has 299 images: 2 ranks score 150 and 149, none counted twice
    result = train_on(
        two_ranks,
        "--dataset",
        "digits",
        "--epochs",
        2,
        "--batch-size",
        16,
        "--eval",
        "--log-every",
        10,
        run_dir=tmp_path,
    )
    assert result.summary["eval_samples"] == 299
    assert 0.5 < result.summary["eval_accuracy"] <= 1.0  # real digits, learnt well above chance (0.1)


def test_straggler_off_by_default_leaves_no_sleep(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert parse_args([]).straggler is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert parse_args(["--straggler", "1:40"]).straggler == (1, 40.0)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("1", "expected RANK:MS"),
        ("one:40", "expected RANK:MS"),
        ("1:-5", "expected RANK:MS"),
        ("1:nan", "expected RANK:MS"),
        ("-1:40", "expected RANK:MS"),
        ("1:40", "there is no rank 1 among 1"),  # a plain python run is a world of one
    ],
)
def test_bad_straggler_is_refused(spec, message, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as info:
        parse_args([f"--straggler={spec}"])  # "=": argparse would read "-1:40" as an option
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_summary_counts_the_devices_a_process_drives(dp_run):
    tmp_path, _ = dp_run
    summary = json.loads((tmp_path / "summary.json").read_text())
    gpus = torch.cuda.device_count()
    assert summary["devices"] == (gpus if gpus > 1 else 1)
    if gpus > 1:  # one peak per GPU, GPU 0 (outputs gathered, loss, gradients) the highest
        peaks = summary["peak_mem_bytes_per_device"]
        assert len(peaks) == gpus and peaks[0] == max(peaks)


# --- notebook 03: fp16 with a GradScaler on any device, every skipped step counted, the TF32 flags


def test_fp16_on_the_cpu_trains_with_a_grad_scaler(two_ranks, tmp_path):
    result = train_on(two_ranks, *TINY, "--amp", "fp16", "--steps", 12, "--lr", 0.1, run_dir=tmp_path)
    summary = result.summary
    assert (summary["amp"], summary["world_size"], summary["backend"]) == ("fp16", 2, "gloo")
    # the scaler ran: its scale is reported, and GradScaler's default start (2**16) skips no step here
    assert summary["grad_scale"] == torch.amp.GradScaler("cpu").get_scale()
    assert summary["skipped_steps"] == 0
    per_step = result.metrics.groupby("step")["loss"].mean()
    assert per_step.iloc[-3:].mean() < per_step.iloc[:3].mean(), per_step.tolist()


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(two_ranks, tmp_path):
    # steps 1 and 2 come before the first log (step 5) and 7 between logs: every one is counted
    forced = [1, 2, 7]
    result = train_on(
        two_ranks,
        *TINY,
        "--log-every",
        5,
        "--amp",
        "fp16",
        "--steps",
        10,
        "--max-grad-norm",
        1.0,
        "--overflow-at-steps",
        *forced,
        "--overflow-rank",
        1,
        run_dir=tmp_path,
    )
    start = torch.amp.GradScaler("cpu").get_scale()
    assert result.summary["skipped_steps"] == len(forced)  # rank 0's count: its own gradients were finite
    assert result.summary["grad_scale"] == start * 0.5 ** len(forced)
    last = result.metrics[result.metrics["step"] == 10].set_index("rank")["grad_scale"]
    assert last.to_dict() == {0: start / 8, 1: start / 8}  # every rank's scaler halved three times
    assert math.isfinite(result.summary["final_loss"])  # the skipped steps left the weights untouched


def test_without_a_scaler_an_overflow_is_not_skipped(tmp_path):
    run_here(*TINY, "--amp", "bf16", "--steps", 4, "--overflow-at-steps", 2, run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    # bf16 runs without a GradScaler: nothing skips the step, the NaN reaches the weights and the loss
    assert summary["skipped_steps"] == 0 and math.isnan(summary["final_loss"])


@pytest.mark.parametrize("amp_dtype", [torch.float16, None])
def test_train_step_clips_the_unscaled_gradients(amp_dtype):
    # the true gradient norm is far below 1e3 and the fp16-scaled one (x 2**16) far above it: a
    # clip before unscale_ would shrink this step; one after it leaves the step as without clipping
    from ddp_helpers.workers.train import Training, train_step

    def one_step(max_grad_norm):
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4)
        scaler = torch.amp.GradScaler("cpu", enabled=amp_dtype is not None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
        training = Training(
            model,
            model,
            optimizer,
            scheduler,
            scaler,
            amp_dtype,
            torch.contiguous_format,
            torch.device("cpu"),
            max_grad_norm,
        )
        train_step(training, torch.randn(8, 16), torch.randint(0, 4, (8,)))
        return model.weight.detach().clone(), training.skipped_steps

    unclipped, skipped = one_step(None)
    clipped, _ = one_step(1e3)
    assert skipped == 0 and torch.equal(clipped, unclipped)
    tightly, _ = one_step(1e-3)  # a bound the true norm exceeds: the step does shrink
    assert not torch.equal(tightly, unclipped)


def test_the_summary_says_what_fp32_meant(single_run):
    tmp_path, _ = single_run
    summary = json.loads((tmp_path / "summary.json").read_text())
    # the flags as this environment sets them (torch's defaults: convolutions may use TF32, matmuls not;
    # an environment variable such as TORCH_ALLOW_TF32_CUBLAS_OVERRIDE can change the matmul one)
    assert summary["cudnn_allow_tf32"] is torch.backends.cudnn.allow_tf32
    assert summary["matmul_allow_tf32"] is torch.backends.cuda.matmul.allow_tf32
    assert summary["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert summary["device_capability"] is None or len(summary["device_capability"]) == 2
