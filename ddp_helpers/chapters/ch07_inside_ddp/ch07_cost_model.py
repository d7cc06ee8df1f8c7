"""The latency-bandwidth (alpha-beta) cost model of an all-reduce, and what it predicts for DDP's buckets.

    fit = fit_alpha_beta(sizes_in_bytes, seconds)      # t(n) = alpha + n * beta, and how well it fits
    buckets = bucket_sizes(param_bytes_in_ready_order, cap_bytes)   # DDP's greedy bucket rule
    exposed_comm_s(buckets, backward_s, fit)           # all-reduce time left after backward ends
    best_cap(param_bytes_in_ready_order, backward_s, fit)

The model of a step: backward produces gradient bytes at a steady rate for `backward_s`; a bucket
is sent when its last gradient is ready; all-reduces run one at a time, in bucket order, each
taking alpha + bytes * beta. What is not finished when backward ends is exposed. Small buckets
pay alpha many times; large ones start late and leave a long tail. It ignores what a real machine
adds: communication that slows compute down (on a CPU both share the cores), several all-reduces
in flight at once, layers whose compute is not proportional to their gradient bytes.
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
    """Weighted least squares, each residual divided by the square root of its time: the noise of a
    timing grows with it, and so the small sizes, which decide alpha, are not drowned by the largest
    (plain least squares lets a 16 MiB all-reduce's noise decide alpha, which can come out negative)."""
    x, t = np.asarray(n_bytes, dtype=float), np.asarray(seconds, dtype=float)
    if len(x) < 3 or np.any(t <= 0):
        raise ValueError("need at least three sizes, each with a positive time")
    weight = 1.0 / np.sqrt(t)
    design = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    fitted = alpha + beta * x
    r2 = 1.0 - float(np.sum((t - fitted) ** 2) / np.sum((t - t.mean()) ** 2))
    return AlphaBeta(float(alpha), float(beta), r2, float(np.max(np.abs(t - fitted) / t)))


def bucket_sizes(
    param_bytes_in_ready_order: list[int], cap_bytes: float, first_cap_bytes: float | None = None
) -> list[int]:
    """DDP's rule: fill a bucket in gradient-ready order until it holds at least the cap, then start
    the next. `first_cap_bytes` caps the first bucket (DDP: 1 MiB when bucket_cap_mb is the default)."""
    buckets: list[int] = []
    size = 0
    for n_bytes in param_bytes_in_ready_order:
        size += n_bytes
        if size >= (first_cap_bytes if first_cap_bytes is not None and not buckets else cap_bytes):
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


def best_cap(
    param_bytes_in_ready_order: list[int], backward_s: float, fit: AlphaBeta, points: int = 200
) -> tuple[float, float]:
    """The bucket cap (bytes), on a log grid from the smallest gradient to all of them, that the model
    says leaves the least all-reduce exposed; and that exposed time in seconds. Of caps that give the
    same layout, the largest: the same buckets, with room to spare."""
    low, high = min(param_bytes_in_ready_order), sum(param_bytes_in_ready_order)
    caps = np.geomspace(low, high, points)[::-1]  # largest first: argmin keeps the first of equals
    exposed = [exposed_comm_s(bucket_sizes(param_bytes_in_ready_order, cap), backward_s, fit) for cap in caps]
    best = int(np.argmin(exposed))
    return float(caps[best]), float(exposed[best])
