"""Run a demo that needs N ranks on whatever this machine has, and say how.

A demo that needs two ranks still gets two on a one-GPU box: NCCL needs one GPU per rank, so with
fewer GPUs than ranks the demo runs N gloo ranks on the CPU, and the notebook says so in one line.
"""

from __future__ import annotations

from ..launcher.machine import visible_gpus


def backend_for(nproc: int, gpus: int | None = None) -> tuple[str, str]:
    """The backend to launch `nproc` ranks with here, and one line that says why.

    Returns ("auto", ...) where every rank gets its own GPU (or there is no GPU at all, so "auto"
    means gloo), and ("gloo", ...) where there are GPUs, but fewer than `nproc`.
    """
    gpus = visible_gpus() if gpus is None else gpus
    if gpus == 0:
        return "auto", f"{nproc} rank(s) on the CPU with gloo (no GPU here)."
    if gpus >= nproc:
        return "auto", f"{nproc} rank(s) with nccl, one GPU each ({gpus} visible)."
    return "gloo", (
        f"This demo needs {nproc} ranks and this machine has {gpus} GPU(s): "
        f"it runs {nproc} gloo ranks on the CPU instead."
    )
