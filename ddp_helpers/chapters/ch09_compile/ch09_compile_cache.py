"""A compile cache folder of its own for each run, so that a first compile is measured cold.

Inductor keeps its FX graph cache and its Triton kernels on disk, under $TORCHINDUCTOR_CACHE_DIR, by
default /tmp/torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py; TRITON_CACHE_DIR defaults
to <that>/triton/<device>, torch 2.7 and 2.14). Nothing in the process clears it: torch._dynamo.reset()
forgets compiled frames, not files, so a rerun on the same node finds the last run's kernels and its
"first compile" looks cheap.
"""

from __future__ import annotations

import time
from pathlib import Path


def fresh_cache_env(root: str | Path) -> dict[str, str]:
    """The launch env that gives a run an empty inductor cache folder under `root`, new at each call."""
    folder = (Path(root) / f"inductor-cache-{time.time_ns()}").resolve()
    folder.mkdir(parents=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder)}
