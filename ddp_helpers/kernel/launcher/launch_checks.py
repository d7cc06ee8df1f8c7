"""The checks and command-line parsers of the launcher's options (see `options`), one of each kind.

One check of a duration (`check_seconds`), one parser of a typed rank list (`rank_list`), one of a
rank list given in Python (`check_rank_list`): every front end uses these. Each per-option check takes
``(name, value)`` and returns the value to keep, or raises `InvalidLaunchArguments` saying what to change.
Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, overload

from ddp_helpers.backends import BACKENDS
from ddp_helpers.errors import InvalidLaunchArguments

LAUNCHERS = ("torchrun", "python")
PROGRESS_CHOICES = ("auto", "widget", "text", "off")

# ---------------------------------------------------------------------------- the shared checks


def check_int(name: str, value: object, minimum: int) -> int:
    """`value` if it is an integer >= `minimum` (a bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLaunchArguments(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidLaunchArguments(f"{name} must be >= {minimum}, got {value}")
    return value


@overload
def check_seconds(
    name: str, value: object, *, allow_none: Literal[False], allow_zero: bool = False
) -> float: ...
@overload
def check_seconds(
    name: str, value: object, *, allow_none: bool, allow_zero: bool = False
) -> float | None: ...
def check_seconds(name: str, value: object, *, allow_none: bool, allow_zero: bool = False) -> float | None:
    """The one check of a duration: a finite number of seconds, > 0 (>= 0 with `allow_zero`), or None."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        what = ">= 0" if allow_zero else "a positive number of"
        raise InvalidLaunchArguments(
            f"{name} must be {what} seconds{' or None' if allow_none else ''}, got {value!r}"
        )
    return float(value)


def rank_list(text: str) -> list[int]:
    """The one parser of a rank list as typed on a command line: ``"0,2"`` -> [0, 2]. Raises ValueError."""
    return [int(part) for part in text.split(",") if part.strip()]


def check_rank_list(value: object) -> list[int] | None:
    """A rank or an iterable of ranks as a list; None if `value` is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        ranks = list(value)
        if all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            return ranks
    return None


def ranks_outside(name: str, ranks: Iterable[int], world_size: int) -> None:
    """Refuse ranks that this world of `world_size` does not have."""
    outside = sorted(r for r in ranks if not 0 <= r < world_size)
    if outside:
        raise InvalidLaunchArguments(
            f"{name} {outside} is outside this world of {world_size} rank(s) (0..{world_size - 1})"
        )


def optional_int_at_least(minimum: int) -> Callable[[str, object], int | None]:
    return lambda name, value: None if value is None else check_int(name, value, minimum)


def int_at_least(minimum: int) -> Callable[[str, object], int]:
    return lambda name, value: check_int(name, value, minimum)


@overload
def seconds(*, allow_none: Literal[False], allow_zero: bool = False) -> Callable[[str, object], float]: ...
@overload
def seconds(*, allow_none: bool, allow_zero: bool = False) -> Callable[[str, object], float | None]: ...
def seconds(*, allow_none: bool, allow_zero: bool = False) -> Callable[[str, object], float | None]:
    return lambda name, value: check_seconds(name, value, allow_none=allow_none, allow_zero=allow_zero)


def one_of(choices: Sequence[str]) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in choices:
            raise InvalidLaunchArguments(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return value

    return check


def check_backend(name: str, value: object) -> str:
    if not isinstance(value, str) or value not in BACKENDS:
        raise InvalidLaunchArguments(f"unknown backend {value!r}; choose one of {', '.join(BACKENDS)}")
    return value


def check_env(name: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidLaunchArguments(f"{name} must be a dict of strings, got {value!r}")
    env = dict(value)
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise InvalidLaunchArguments(f"env keys and values must be strings; check {bad}")
    return env


def check_show_ranks(name: str, value: object) -> str | list[int]:
    """ "all", "none" (also for None) or a list of ranks; whether they exist waits for the world size."""
    if value == "all" or value == "none" or value is None:
        return "all" if value == "all" else "none"
    ranks = check_rank_list(value)
    if ranks is None:
        raise InvalidLaunchArguments(
            f"{name} must be 'all', 'none', a rank or a list of ranks, got {value!r}"
        )
    return ranks


def check_path(name: str, value: object) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise InvalidLaunchArguments(f"{name} must be a path, got {value!r}")
    path = Path(value).expanduser().resolve()
    # an ancestor that is a file would surface later as a raw NotADirectoryError
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise InvalidLaunchArguments(f"{name} {path} cannot be created: {folder} is a file")
            break
    return path


def check_optional_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidLaunchArguments(f"{name} must be a string, got {value!r}")
    return value


def check_program(name: str, value: object) -> str:
    path = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(path, str) or not path:
        raise InvalidLaunchArguments(f"{name} must be the path of a Python interpreter, got {value!r}")
    return path


# ---------------------------------------------------------------------------- reading a command line


def parse_show_ranks(text: str) -> str | list[int]:
    """``--show-ranks``: "all", "none" or comma-separated ranks."""
    if text in ("all", "none"):
        return text
    try:
        return rank_list(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'all', 'none' or comma-separated ranks, got {text!r}") from None


def parse_env_item(text: str) -> tuple[str, str]:
    """``--env KEY=VALUE`` (repeatable)."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"KEY=VALUE, got {text!r}")
    return key, value
