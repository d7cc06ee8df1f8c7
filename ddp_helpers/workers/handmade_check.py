"""handmade_ddp.py's check: each hand-made version's weights and buffers against DDP's, on every rank."""

import argparse
import statistics
from typing import Any

import torch
import torch.nn as nn

from ddp_helpers.distributed import DistInfo
from ddp_helpers.workers.experiment_kit import slowest


def flat_state(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """All weights, and all floating-point buffers (BatchNorm's running statistics), each as one vector."""
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    buffers = [b.reshape(-1) for b in model.buffers() if b.is_floating_point()]
    return weights, (torch.cat(buffers).cpu() if buffers else torch.zeros(0))


def compare_to_ddp(
    variant: str,
    args: argparse.Namespace,
    info: DistInfo,
    times: list[float],
    allreduces: list[int],
    state: tuple[torch.Tensor, torch.Tensor],
    reference: tuple[torch.Tensor, torch.Tensor],
) -> dict:
    """One variant's step time and its weights and buffers against DDP's, on every rank; raises if they differ."""
    (weights, buffers), (ddp_weights, ddp_buffers) = state, reference
    # this rank's weights and buffers against DDP's on this rank: rank 1's running statistics
    # match DDP's only if the version broadcast rank 0's buffers before each forward, as DDP does
    max_diff = (weights - ddp_weights).abs().max().item()  # this rank's
    buffer_diff = (buffers - ddp_buffers).abs().max().item() if len(buffers) else 0.0
    matches = torch.allclose(torch.cat(state), torch.cat(reference), rtol=args.rtol, atol=args.atol)
    all_match = slowest(0.0 if matches else 1.0, info.device) == 0.0  # every rank agrees
    r: dict[str, Any] = {
        "step_time_s": slowest(statistics.median(times[args.warmup_steps :]), info.device),
        "allreduces_per_step": allreduces[-1] if allreduces else None,
        "max_abs_diff_vs_ddp": slowest(max_diff, info.device),
        "buffer_max_abs_diff_vs_ddp": slowest(buffer_diff, info.device),
        "equal_to_ddp": all_match,
    }
    if info.is_main:
        print(
            f"{variant:>9}: {r['step_time_s'] * 1e3:8.2f} ms/step, max |w - w_ddp| = "
            f"{r['max_abs_diff_vs_ddp']:.2e}, buffers {r['buffer_max_abs_diff_vs_ddp']:.2e} "
            f"({'equal' if all_match else 'DIFFERENT'})",
            flush=True,
        )
    if not all_match:
        raise AssertionError(
            f"{variant}: weights or buffers after {args.steps} steps differ from DDP's on some rank "
            f"(max {r['max_abs_diff_vs_ddp']:.3e} in the weights, "
            f"{r['buffer_max_abs_diff_vs_ddp']:.3e} in the buffers)"
        )
    return r
