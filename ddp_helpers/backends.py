"""The one rule that picks the backend and the device, shared by the launcher and every worker (no torch)."""

from __future__ import annotations

BACKENDS = ("auto", "gloo", "nccl")


def resolve_backend(requested: str, gpus: int) -> tuple[str, str]:
    """("nccl", "cuda") or ("gloo", "cpu") for `requested` ("auto", "gloo" or "nccl") and `gpus` visible."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "auto":
        requested = "nccl" if gpus > 0 else "gloo"
    if requested == "nccl" and gpus == 0:
        raise ValueError("backend 'nccl' needs CUDA GPUs and none are visible; use 'gloo' on the CPU")
    return requested, ("cuda" if requested == "nccl" else "cpu")
