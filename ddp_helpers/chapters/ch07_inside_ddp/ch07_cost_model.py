"""The latency-bandwidth (alpha-beta) cost model of an all-reduce, and what it predicts for DDP's buckets.

Backward makes gradient bytes at a steady rate; each bucket's all-reduce (alpha + bytes * beta) starts when it is
full and after the one before; what runs past backward's end is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    """t(n) = alpha_s + n * beta_s_per_byte, fitted to measured all-reduce times."""

    alpha_s: float  # the fixed cost of one all-reduce (latency)
    beta_s_per_byte: float  # the cost of each byte (1 / bandwidth)
    r2: float  # the share of the times' variance the line explains
    max_relative_residual: float  # the worst |measured - fitted| / measured

    def seconds(self, n_bytes: float) -> float:
        return self.alpha_s + n_bytes * self.beta_s_per_byte


def fit_alpha_beta(n_bytes: list[float], seconds: list[float]) -> AlphaBeta:
    """Least squares weighted by 1/sqrt(time), so the large sizes' noise does not decide alpha."""
    x, t = np.asarray(n_bytes, dtype=float), np.asarray(seconds, dtype=float)
    if len(x) < 3 or np.any(t <= 0):
        raise ValueError("need at least three sizes, each with a positive time")
    weight = 1.0 / np.sqrt(t)
    design = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    fitted = alpha + beta * x
    r2 = 1.0 - float(np.sum((t - fitted) ** 2) / np.sum((t - t.mean()) ** 2))
    return AlphaBeta(float(alpha), float(beta), r2, float(np.max(np.abs(t - fitted) / t)))


def bucket_sizes(param_bytes_in_ready_order: list[int], cap_bytes: float) -> list[int]:
    """DDP's rule: fill a bucket in ready order until it holds the cap."""
    buckets: list[int] = []
    size = 0
    for n_bytes in param_bytes_in_ready_order:
        size += n_bytes
        if size >= cap_bytes:
            buckets.append(size)
            size = 0
    return buckets + ([size] if size else [])


def exposed_comm_s(bucket_bytes: list[int], backward_s: float, fit: AlphaBeta) -> float:
    """Seconds of all-reduce still running when backward ends, in the model above."""
    total, produced, comm_end = sum(bucket_bytes), 0, 0.0
    for n_bytes in bucket_bytes:
        produced += n_bytes
        ready = backward_s * produced / total  # the bucket's last gradient is ready
        comm_end = max(ready, comm_end) + fit.seconds(n_bytes)  # after the previous all-reduce
    return comm_end - backward_s


def best_cap(param_bytes_in_ready_order: list[int], backward_s: float, fit: AlphaBeta) -> tuple[float, float]:
    """The cap on a log grid (the largest of equals) the model says leaves the least exposed, and that time."""
    low, high = min(param_bytes_in_ready_order), sum(param_bytes_in_ready_order)
    caps = np.geomspace(low, high, 200)[::-1]  # largest first: argmin keeps the first of equals
    exposed = [exposed_comm_s(bucket_sizes(param_bytes_in_ready_order, cap), backward_s, fit) for cap in caps]
    best = int(np.argmin(exposed))
    return float(caps[best]), float(exposed[best])
