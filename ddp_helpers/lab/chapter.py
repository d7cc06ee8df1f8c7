"""The setup every chapter starts with: the GPUs this machine has, and the ranks its launches use."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..launcher.agent_client import warm_up
from ..launcher.config import base_environment
from ..launcher.machine import visible_gpus
from .demo_backend import backend_for


@dataclass(frozen=True)
class Chapter:
    gpus: int  # visible GPUs, counted without a CUDA context in this kernel: the ranks own them
    nproc: int  # the ranks the chapter's launches use

    def backend_for(self, ranks: int) -> tuple[str, str]:
        """The backend for a demo of `ranks` ranks here, and the line that says which (see demo_backend)."""
        return backend_for(ranks, self.gpus)


def chapter_setup(nproc: int | None) -> Chapter:
    """Count the GPUs, then choose the ranks: the notebook's `nproc` parameter if given, else one per
    GPU, else 2 on the CPU (the fewest that show DDP at work).

    Also starts the agent server that the chapter's launches fork torchrun's agent from
    (launcher/agent_client.py): it imports torch while the next cells run, so the first launch finds it
    ready."""
    if nproc is not None and (not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1):
        raise ValueError(f"nproc must be a whole number of ranks, at least 1, or None; got {nproc!r}")
    gpus = visible_gpus()
    warm_up(sys.executable, base_environment())
    return Chapter(gpus=gpus, nproc=nproc or gpus or 2)
