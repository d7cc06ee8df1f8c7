"""A compile cache folder of its own for each run, so that a first compile is measured cold.

Inductor's cache lives on disk and torch._dynamo.reset() does not clear it.
"""

from __future__ import annotations

import time
from pathlib import Path


def fresh_cache_env(root: str | Path) -> dict[str, str]:
    """The launch env that gives a run an empty inductor cache folder under `root`, new at each call."""
    folder = (Path(root) / f"inductor-cache-{time.time_ns()}").resolve()
    folder.mkdir(parents=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder)}
