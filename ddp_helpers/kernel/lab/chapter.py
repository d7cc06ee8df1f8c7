"""The one call every chapter's setup cell makes: the GPUs here, the ranks, the plan, the workers."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_helpers.kernel.lab.plan_core import NotebookPlan, plan_for
from ddp_helpers.kernel.launcher.agent_client import warm_up
from ddp_helpers.kernel.launcher.config import base_environment
from ddp_helpers.kernel.launcher.machine import visible_gpus
from ddp_helpers.kernel.launcher.options import check_nproc
from ddp_helpers.kernel.launcher.worker_files import write_worker


@dataclass(frozen=True)
class Chapter:
    notebook: str  # "04": its plan is ddp_helpers/chapters/ch04_checkpointing/ch04_plan.py
    gpus: int  # visible GPUs per node, counted without a CUDA context in this kernel: the ranks own them
    nproc: int  # the ranks per node the chapter's launches use
    plan: NotebookPlan  # backend, device, sizes and runs compared, for this machine
    workers: dict[str, Path] = field(default_factory=dict)  # each worker's copy in runs/workers/<notebook>


def chapter_setup(
    notebook: str,
    nproc: int | None,
    *,
    smoke: bool = False,
    nodes: int = 1,
    workers: Iterable[str] = (),
    **plan_options: Any,
) -> Chapter:
    """Count the GPUs, choose the ranks, plan the notebook, and write the workers it launches."""
    check_nproc("nproc", nproc)  # a ValueError (InvalidLaunchArguments), as launch() says it
    gpus = visible_gpus() // nodes
    ranks = nproc or gpus or 2
    plan = plan_for(notebook, gpus, ranks, nodes, smoke=smoke, **plan_options)  # checks `notebook` first
    warm_up(sys.executable, base_environment())
    folder = Path("runs") / "workers" / notebook  # one notebook's edit never changes another's run
    written = {name: write_worker(name, folder, show=False) for name in workers}
    return Chapter(notebook=notebook, gpus=gpus, nproc=ranks, plan=plan, workers=written)
