"""Find processes by a marker in their environment: proof that no rank of a run is left behind.

A launcher under test exports a unique marker; every process it starts inherits it, so any
process still carrying the marker after the launcher returned is one it left running.
"""

from __future__ import annotations

import psutil


def processes_marked(name: str, value: str) -> list[int]:
    """Pids of the live processes whose environment has `name` set to `value` (this user's only:
    other users' environments cannot be read, and are skipped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(name) == value:
                found.append(proc.pid)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found
