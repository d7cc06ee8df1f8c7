"""Look inside torch's DDP: profiled steps, bucket sizes, all-reduce times, no_sync(), a recording comm hook,
gradient_as_bucket_view.

    torchrun --nproc-per-node 2 inside_ddp.py --experiments profile,buckets,allreduce,no_sync,hooks,options
"""

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile, record_function

from ddp_helpers.chapters.ch07_inside_ddp.experiment_kit import (
    Batches,
    activities,
    add_arguments,
    build_model,
    count_allreduces,
    ddp_logging,
    gradient_bytes,
    make_batches,
    make_ddp,
    median_step_s,
    slowest,
    synchronize,
    train,
    train_step,
)
from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import DistInfo, setup_distributed
from ddp_helpers.rank.metrics import MetricsWriter

EXPERIMENTS = ("profile", "buckets", "allreduce", "no_sync", "hooks", "options")


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the memory block behind `tensor`: views of one block share it."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def record_buckets_hook(log: list, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The default all-reduce (average the bucket), plus a note of each bucket's size and time."""
    start = time.perf_counter()
    buffer = bucket.buffer().div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def note(done: torch.futures.Future) -> torch.Tensor:
        log.append(
            {
                "bucket": bucket.index(),
                "bytes": buffer.numel() * buffer.element_size(),
                "tensors": len(bucket.gradients()),
                "seconds": time.perf_counter() - start,
                "storage": storage_of(buffer),
            }
        )
        return done.value()[0]

    return future.then(note)


# ---------------------------------------------------------------------------- experiments


def experiment_profile(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    """Profile DDP's own buckets, then the same steps with one bucket: every all-reduce after backward."""
    own = profile_steps(args, info, batches, args.bucket_cap_mb, "traces")
    size_mb = gradient_bytes(build_model(args.model, args.width, args.depth)) / 2**20
    one = profile_steps(args, info, batches, 2 * size_mb, "traces_one_bucket")  # the cap is never reached
    return {**own, "one_bucket": one}


def profile_steps(
    args: argparse.Namespace, info: DistInfo, batches: Batches, cap_mb: float | None, directory: str
) -> dict:
    """Warm up (DDP rebuilds its buckets after the first step), then profile a few steps."""
    model = make_ddp(args, info, cap_mb)
    if hasattr(model, "_set_ddp_runtime_logging_sample_rate"):
        model._set_ddp_runtime_logging_sample_rate(1)  # DDP's own timers, every step
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for inputs, targets in batches[: args.warmup_steps]:
        train_step(model, optimizer, inputs, targets)
    with profile(activities=activities(info)) as prof:
        for step, (inputs, targets) in enumerate(batches[args.warmup_steps :][: args.profile_steps]):
            with record_function(f"step {step}"):
                train_step(model, optimizer, inputs, targets)
            synchronize(info.device)
    trace = Path(args.run_dir) / directory / f"rank{info.rank}.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    dist.barrier()  # every rank's trace is on disk before rank 0 reports
    return {
        "traces": str(trace.parent),
        "steps": args.profile_steps,
        "allreduces": count_allreduces(prof),
        "ddp_logging": ddp_logging(model),
    }


def bucket_layout(
    args: argparse.Namespace, info: DistInfo, cap_mb: float | None, batches: Batches
) -> list[dict]:
    """The buckets DDP reduces once it has rebuilt them (from the second step on), seen by our hook."""
    model = make_ddp(args, info, cap_mb)
    log: list[dict] = []
    model.register_comm_hook(log, record_buckets_hook)
    for inputs, targets in batches[:2]:
        log.clear()
        F.cross_entropy(model(inputs), targets).backward()
    return sorted(log, key=lambda entry: entry["bucket"])


def experiment_buckets(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    rows = []
    for cap in [None, *args.bucket_caps]:  # None: DDP's default, first bucket included
        model = make_ddp(args, info, cap)
        step_time, _ = train(model, batches, args, info)
        layout = bucket_layout(args, info, cap, batches)
        rows.append(
            {
                "bucket_cap_mb": "default" if cap is None else cap,
                "step_time_s": step_time,
                "buckets": len(layout),
                "bucket_bytes": [b["bytes"] for b in layout],
                "ddp_logging": ddp_logging(model),
            }
        )
        if info.is_main:
            print(
                f"bucket_cap_mb={rows[-1]['bucket_cap_mb']}: {len(layout)} bucket(s), "
                f"{step_time * 1e3:.2f} ms/step",
                flush=True,
            )
    plain = build_model(args.model, args.width, args.depth)
    # the order backward produces gradients in, for a model used in registration order (a cost model's input)
    ready_order = [p.numel() * p.element_size() for p in reversed(list(plain.parameters()))]
    return {
        "rows": rows,
        "default_first_bucket_bytes": getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", None),
        "param_bytes_in_ready_order": ready_order,
    }


def experiment_allreduce(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    """One all-reduce's time per size: --iters back to back, --repeats rounds, median of the slowest rank."""
    buffers = [torch.ones(n_bytes // 4, device=info.device) for n_bytes in args.allreduce_bytes]  # float32
    times = torch.zeros(args.repeats, len(buffers), dtype=torch.float64)
    for repeat in range(-1, args.repeats):  # round -1 warms gloo up for every size, untimed
        for index, buffer in enumerate(buffers):
            dist.barrier()
            synchronize(info.device)
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(buffer)
            synchronize(info.device)
            if repeat >= 0:
                times[repeat, index] = (time.perf_counter() - start) / args.iters
    times = times.to(info.device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # an all-reduce is done when its slowest rank is
    medians = times.cpu().median(dim=0).values.tolist()
    rows = [{"bytes": n, "seconds": t} for n, t in zip(args.allreduce_bytes, medians, strict=True)]
    return {"rows": rows, "repeats": args.repeats, "iters": args.iters}


def accumulate(
    model: DDP, optimizer: torch.optim.Optimizer, micro_batches: Batches, use_no_sync: bool
) -> None:
    """One optimizer step over several micro-batches; with no_sync(), only the last one all-reduces."""
    for i, (inputs, targets) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
            loss = F.cross_entropy(model(inputs), targets) / len(micro_batches)
            loss.backward()  # without no_sync(), every backward all-reduces every bucket
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def experiment_no_sync(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    groups = [batches[i : i + args.accumulate] for i in range(0, len(batches), args.accumulate)]
    groups = [group for group in groups if len(group) == args.accumulate]
    results, weights = {}, {}
    for use_no_sync in (False, True):
        model = make_ddp(args, info, args.bucket_cap_mb)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        timed = len(groups) - 1  # the last step is profiled, to count the all-reduces
        step_s = median_step_s(
            lambda i: accumulate(model, optimizer, groups[i], use_no_sync),  # noqa: B023 (called at once)
            timed,
            min(args.warmup_steps, timed - 1),
            info.device,
        )
        with profile(activities=activities(info)) as prof:
            accumulate(model, optimizer, groups[-1], use_no_sync)
        name = "no_sync" if use_no_sync else "sync_every_micro_batch"
        results[name] = {
            "step_time_s": step_s,
            "allreduces_per_step": count_allreduces(prof),
        }
        weights[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    max_diff = (weights["no_sync"] - weights["sync_every_micro_batch"]).abs().max().item()
    equal = torch.allclose(
        weights["no_sync"], weights["sync_every_micro_batch"], rtol=args.rtol, atol=args.atol
    )
    return {
        **results,
        "accumulate": args.accumulate,
        "optimizer_steps": len(groups),
        "max_abs_diff": slowest(max_diff, info.device),
        "equal": slowest(float(not equal), info.device) == 0,
    }


def experiment_hooks(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    """DDP with no hook, then with the recording hook: the same loss, and one step's buckets."""
    results: dict[str, dict[str, Any]] = {}
    for name in ("none", "record"):
        model = make_ddp(args, info, args.bucket_cap_mb)
        log: list[dict] = []
        if name == "record":
            model.register_comm_hook(log, record_buckets_hook)
        step_time, final_loss = train(model, batches, args, info)
        results[name] = {"step_time_s": step_time, "final_loss": slowest(final_loss, info.device)}
    log.clear()  # one more backward, to keep one step's buckets
    inputs, targets = batches[0]
    F.cross_entropy(model(inputs), targets).backward()
    results["record"]["buckets"] = sorted(log, key=lambda entry: entry["bucket"])
    return results


OPTIONS = {
    "default": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
}  # .grad in the buckets


def gradient_memory(args: argparse.Namespace, info: DistInfo, batches: Batches, options: dict) -> dict:
    """Bytes of the distinct blocks holding gradients (.grad and buckets), on a second step."""
    model = make_ddp(args, info, args.bucket_cap_mb, **options)
    log: list[dict] = []
    model.register_comm_hook(log, record_buckets_hook)
    for inputs, targets in batches[:2]:
        log.clear()
        model.zero_grad(set_to_none=True)  # as the training loop does
        F.cross_entropy(model(inputs), targets).backward()
    grads = {storage_of(p.grad) for p in model.parameters() if p.grad is not None}
    buckets = {entry["storage"] for entry in log}
    return {
        "grad_storages": len(grads),
        "bucket_storages": len(buckets),
        "grad_bytes": sum(
            p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
        ),
        "grads_are_bucket_views": grads <= buckets,  # every .grad lives in a bucket's block
        "gradient_memory_bytes": sum(n_bytes for _, n_bytes in grads | buckets),
    }


def experiment_options(args: argparse.Namespace, info: DistInfo, batches: Batches) -> dict:
    results = {}
    for name, options in OPTIONS.items():
        step_time, _ = train(make_ddp(args, info, args.bucket_cap_mb, **options), batches, args, info)
        results[name] = {"step_time_s": step_time, **gradient_memory(args, info, batches, options)}
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--experiments", default=",".join(EXPERIMENTS), help=f"comma-separated: {', '.join(EXPERIMENTS)}"
    )
    add_arguments(
        p,
        "runs/inside_ddp",
        batch_help="per rank (per micro-batch for no_sync)",
        steps_help="training steps per measured configuration",
    )
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="all but buckets; default: DDP's")
    p.add_argument("--bucket-caps", default="1,5,25,100", help="the bucket_cap_mb values to sweep")
    p.add_argument(
        "--allreduce-bytes",
        default=",".join(str(4**k) for k in range(6, 13)),
        help="all-reduce sizes in bytes to time (allreduce); default 4 KiB to 16 MiB, x4",
    )
    p.add_argument("--repeats", type=int, default=9, help="timed rounds over the sizes (allreduce)")
    p.add_argument("--iters", type=int, default=3, help="all-reduces back to back per timing (allreduce)")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step (no_sync)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-6)
    args = p.parse_args(argv)
    args.experiments = [e for e in args.experiments.split(",") if e]
    args.bucket_caps = [float(c) for c in args.bucket_caps.split(",") if c]
    args.allreduce_bytes = [int(b) for b in args.allreduce_bytes.split(",") if b]
    if set(args.experiments) - set(EXPERIMENTS):
        p.error(f"experiments come from {', '.join(EXPERIMENTS)}")
    if args.steps <= args.warmup_steps or args.accumulate < 1 or args.repeats < 1 or args.iters < 1:
        p.error("need --steps > --warmup-steps, and --accumulate, --repeats and --iters >= 1")
    if any(n_bytes < 4 for n_bytes in args.allreduce_bytes):
        p.error("--allreduce-bytes: each size holds at least one float32 (4 bytes)")
    return args


@record
def main(argv: list[str] | None = None) -> None:  # argv: for a caller in-process (live ranks)
    args = parse_args(argv)
    info = setup_distributed()
    if not info.distributed:
        raise SystemExit("run me under torchrun: DDP needs a process group")
    writer = MetricsWriter(args.run_dir, info.rank)
    writer.write_plan(len(args.experiments))
    measured = max(args.steps, args.warmup_steps + args.profile_steps)  # batches most experiments train on
    # enough batches for the longest experiment: no_sync takes `accumulate` per optimizer step
    n_batches = measured * max(1, args.accumulate)
    batches = make_batches(
        args.model, args.width, args.image_size, args.batch_size, n_batches, info.rank, info.device
    )
    summary = {
        "world_size": info.world_size,
        "backend": info.backend,
        "device": info.device.type,
        "torch_version": torch.__version__,
        "model": args.model,
        "bucket_cap_mb": args.bucket_cap_mb,
    }
    for step, name in enumerate(args.experiments, start=1):
        start = time.perf_counter()
        # every experiment but no_sync trains on the first --steps batches
        data = batches if name == "no_sync" else batches[:measured]
        summary[name] = globals()[f"experiment_{name}"](args, info, data)
        writer.log(step=step, experiment=name, seconds=time.perf_counter() - start)
        if info.is_main:
            print(f"{name}: done in {time.perf_counter() - start:.1f} s", flush=True)
    writer.write_summary(summary)
    writer.close()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
