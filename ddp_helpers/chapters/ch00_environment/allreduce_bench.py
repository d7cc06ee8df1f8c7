"""Check all_reduce on every rank and measure its bandwidth (nccl-tests' algbw and busbw) over message sizes.

torchrun --nproc-per-node 2 allreduce_bench.py --min-bytes 1024 --max-bytes 67108864
"""

import argparse
import statistics
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_helpers.rank import teardown
from ddp_helpers.rank.distributed import setup_distributed, under_torchrun
from ddp_helpers.rank.metrics import MetricsWriter
from ddp_helpers.run_contract import run_dir_from_env


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-bytes", type=int, default=1 << 10)
    p.add_argument("--max-bytes", type=int, default=1 << 24)
    p.add_argument("--iters", type=int, default=10, help="timed all_reduces per size")
    p.add_argument("--warmup", type=int, default=3, help="untimed all_reduces per size")
    p.add_argument("--run-dir", default=run_dir_from_env("runs/allreduce"))
    args = p.parse_args()
    if not 4 <= args.min_bytes <= args.max_bytes:
        p.error("need 4 <= --min-bytes <= --max-bytes")
    if args.iters < 1 or args.warmup < 0:
        p.error("need --iters >= 1 and --warmup >= 0")
    return args


def sizes(min_bytes: int, max_bytes: int) -> Iterator[int]:
    size = min_bytes
    while size <= max_bytes:
        yield size
        size *= 4


def measure(
    nbytes: int, args: argparse.Namespace, rank: int, world_size: int, device: torch.device
) -> tuple[dict, dict]:
    """One size: the summary's row (every rank's view, reduced) and this rank's own row."""
    numel = nbytes // 4  # float32
    # rank r contributes r+1 everywhere, so the sum is n(n+1)/2 in every element
    tensor = torch.full((numel,), float(rank + 1), device=device)
    expected = world_size * (world_size + 1) / 2
    dist.all_reduce(tensor)
    seen = torch.stack([tensor.min(), tensor.max()]).to(torch.float64)  # every element, not one
    times = []
    for i in range(args.warmup + args.iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()  # start together, or we time the stragglers' arrival
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:  # the first calls set up connections and buffers: not timed
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)  # one slow call cannot move it
    # the slowest rank decides when the collective is done
    t = torch.tensor([median], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lowest, highest = seen[:1].clone(), seen[1:].clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)  # over every rank
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    seconds = t.item()
    message = tensor.numel() * tensor.element_size()  # the bytes each rank hands to all_reduce
    algbw = message / seconds
    # nccl-tests' bus bandwidth: a ring sends 2(n-1)/n of the message over each link
    busbw = algbw * 2 * (world_size - 1) / world_size
    correct = lowest.item() == highest.item() == expected
    summary_row = {
        "bytes": message,
        "time_s": seconds,
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": busbw / 1e9,
        "sum_min": lowest.item(),
        "sum_max": highest.item(),
        "correct_all_ranks": correct,
    }
    rank_row = {
        "bytes": message,
        "time_s": median,
        "times_s": times,
        "warmup": args.warmup,
        "sum_min": seen[0].item(),
        "sum_max": seen[1].item(),
    }
    return summary_row, rank_row


@record
def main() -> None:
    args = parse_args()
    if not under_torchrun():
        raise SystemExit(
            "allreduce_bench.py needs several processes: run it with torchrun --nproc-per-node N"
        )
    # nccl on cuda:LOCAL_RANK where GPUs exist (set_device, then init_process_group with device_id),
    # gloo on the CPU otherwise; the launcher's choice arrives in DDP_BACKEND
    info = setup_distributed()
    rank, world_size, device, backend = info.rank, info.world_size, info.device, info.backend
    writer = MetricsWriter(args.run_dir, rank)
    plan = list(sizes(args.min_bytes, args.max_bytes))
    writer.write_plan(len(plan))
    results = []
    for step, nbytes in enumerate(plan, start=1):
        row, own = measure(nbytes, args, rank, world_size, device)
        results.append(row)
        writer.log(step=step, **own)
        if rank == 0:
            print(
                f"{row['bytes']:>12,d} B  {row['time_s'] * 1e6:10.1f} us  algbw {row['algbw_gbps']:7.3f} GB/s  "
                f"busbw {row['busbw_gbps']:7.3f} GB/s  {'ok' if row['correct_all_ranks'] else 'WRONG SUM'}"
            )
    writer.write_summary(
        {
            "world_size": world_size,
            "backend": backend,
            "device": device.type,
            "torch_version": torch.__version__,
            "expected_sum": world_size * (world_size + 1) / 2,
            "all_correct": all(r["correct_all_ranks"] for r in results),
            "results": results,
        }
    )
    writer.close()
    dist.barrier()


if __name__ == "__main__":
    try:
        main()
    finally:
        teardown.destroy_process_group()  # after @record has written any error (see teardown.py)
