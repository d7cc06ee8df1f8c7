"""What a right script does, replayed in one process: the contract's training, rank by rank, step by step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ddp_helpers.chapters.ch10_capstone.ch10_contract import (
    CLASSES,
    CLIP,
    DROPOUT,
    FEATURES,
    HIDDEN,
    LR,
    MOMENTUM,
    SEED,
)


def replay(
    data: dict[str, Any],
    world: int,
    amp: str,
    batches: list[list[list[int]]],
    masks: list[list[Any]],
    steps: int,
    unscale_first: bool = True,
    fresh_at: int | None = None,
    fresh: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What a right script does, step by step, computed in this process on the CPU."""
    import torch

    params = _initial_params()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)

    def new_optimizer() -> Any:
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)

    def new_scaler() -> Any:
        return torch.amp.GradScaler("cpu", enabled=amp == "fp16")

    optimizer, scaler = new_optimizer(), new_scaler()
    out: list[dict[str, Any]] = [{"weights": torch.cat([p.detach().flatten() for p in params]).tolist()}]
    for t in range(steps):
        if t == fresh_at:
            optimizer = new_optimizer() if "optimizer" in fresh else optimizer
            scaler = new_scaler() if "scaler" in fresh else scaler
        ranks = [
            _backward(data, params, batches[rank][t], masks[rank][t], dtype, scaler) for rank in range(world)
        ]
        _all_reduce(params, [grads for grads, _, _ in ranks])
        finite = all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)
        if unscale_first:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        scaler.step(optimizer)
        scaler.update()
        out.append(
            {
                "losses": [loss for _, loss, _ in ranks],
                "mean": sum(loss * n for _, loss, n in ranks) / sum(n for _, _, n in ranks),
                "stepped": finite or not scaler.is_enabled(),
                "scale": scaler.get_scale() if scaler.is_enabled() else None,
                "weights": torch.cat([p.detach().flatten() for p in params]).tolist(),
            }
        )
    return out


def _initial_params() -> list[Any]:
    """The model's two weights as the contract builds them, right after torch.manual_seed(seed)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        w1 = torch.nn.Linear(FEATURES, HIDDEN, bias=False).weight.detach().clone()
        w2 = torch.nn.Linear(HIDDEN, CLASSES, bias=False).weight.detach().clone()
    return [w1.requires_grad_(), w2.requires_grad_()]


def _all_reduce(params: list[Any], grads: list[list[Any]]) -> None:
    """DDP's average: each rank's gradient divided by the world size, then summed, into each param's .grad."""
    import torch

    for i, p in enumerate(params):
        p.grad = torch.zeros_like(p)
        for rank in grads:
            p.grad += rank[i] / len(grads)


def _backward(
    data: dict[str, Any], params: list[Any], batch: list[int], mask: Any, dtype: Any, scaler: Any
) -> tuple[list[Any], float, int]:
    """One rank's step before DDP's all-reduce: its gradients (of the scaled loss), its loss, its batch size."""
    import torch
    import torch.nn.functional as F

    index = torch.tensor(batch)
    leaves = [p.detach().clone().requires_grad_() for p in params]
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        hidden = torch.tanh(F.linear(data["x"][index], leaves[0]))
        hidden = hidden * (mask.to(hidden.dtype) / (1 - DROPOUT))  # as the probe's dropout applies its mask
        loss = F.cross_entropy(F.linear(hidden, leaves[1]), data["y"][index])
    scaler.scale(loss).backward()
    return [leaf.grad for leaf in leaves], loss.item(), len(batch)


def drift(weights: Sequence[float], expected: Sequence[float], start: Sequence[float]) -> float:
    """How far `weights` are from `expected`, relative to how far training moved the expected ones."""
    if len(weights) != len(expected):
        return math.inf
    off = math.sqrt(sum((a - b) ** 2 for a, b in zip(weights, expected, strict=True)))
    moved = math.sqrt(sum((a - b) ** 2 for a, b in zip(expected, start, strict=True)))
    return off / max(moved, 1e-12) if off == off else math.inf
