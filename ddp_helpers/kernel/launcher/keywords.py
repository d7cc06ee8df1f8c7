"""`launch()`'s and `start_ranks()`'s keywords for a type checker: `LaunchOptions`' fields, names and
types, written out (a TypedDict cannot be built from a dataclass; tests/kernel/test_launch_options.py holds
them equal to the fields, so a field added in options.py without its line here fails a test)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TypedDict


class LaunchKeywords(TypedDict, total=False):
    """`launch()`'s keywords for a type checker: `LaunchOptions`' fields, names and types, written out.

    (A TypedDict cannot be built from a dataclass; tests/kernel/test_launch_options.py holds the two equal.)
    """

    nproc: int | None
    backend: str
    timeout: float | None
    startup_timeout: float | None
    run_dir: str | os.PathLike[str] | None
    env: dict[str, str]
    max_restarts: int
    show_ranks: str | int | Iterable[int] | None
    progress: str
    grace_s: float
    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    rdzv_timeout: float | None
    launcher: str
    python: str


class LiveKeywords(TypedDict, total=False):
    """`start_ranks()`'s keywords for a type checker: the fields marked ``live``, names and types
    (tests/kernel/test_launch_options.py holds them equal)."""

    nproc: int | None
    backend: str
    timeout: float | None
    startup_timeout: float | None
    run_dir: str | os.PathLike[str] | None
    env: dict[str, str]
    show_ranks: str | int | Iterable[int] | None
