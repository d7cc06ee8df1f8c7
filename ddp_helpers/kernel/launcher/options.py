"""Every launcher option, declared once as a field of `LaunchOptions`; `LaunchConfig`, `launch()`'s signature,
`start_ranks` and ``%ranks start`` are built from them (tests/kernel/test_launch_options.py)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import math
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ddp_helpers.backends import BACKENDS
from ddp_helpers.errors import InvalidLaunchArguments

D = TypeVar("D")  # an option's default
C = TypeVar("C")  # what its check keeps
F = TypeVar("F", bound=Callable[..., Any])

# No run waits silently for ever by default: longer than any silence of the notebooks' runs, shorter than
# the 600 s a headless notebook cell gets (papermill, CI).
DEFAULT_HANG_TIMEOUT_S = 300.0
METADATA_KEY = "ddp_helpers.option"


def check_int(name: str, value: object, minimum: int, allow_none: bool = False) -> Any:
    """`value` if it is an integer >= `minimum` (not a bool), or None if allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLaunchArguments(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidLaunchArguments(f"{name} must be >= {minimum}, got {value}")
    return value


def check_seconds(name: str, value: object, *, allow_none: bool, allow_zero: bool = False) -> Any:
    """A finite number of seconds, > 0 (>= 0 with `allow_zero`), or None if allowed."""
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


def one_of(choices: Sequence[str]) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in choices:
            raise InvalidLaunchArguments(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return value

    return check


def check_env(name: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping | None):
        raise InvalidLaunchArguments(f"{name} must be a dict of strings, got {value!r}")
    env = dict(value or {})
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise InvalidLaunchArguments(f"env keys and values must be strings; check {bad}")
    return env


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
    outside = sorted(r for r in ranks if not 0 <= r < world_size)
    if outside:
        raise InvalidLaunchArguments(
            f"{name} {outside} is outside this world of {world_size} rank(s) (0..{world_size - 1})"
        )


def check_show_ranks(name: str, value: object) -> str | list[int]:
    """ "all", "none" (also for None) or a list of ranks; whether they exist waits for the world size."""
    if value in ("all", "none", None):
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
    folder = next(folder for folder in (path, *path.parents) if folder.exists())
    if not folder.is_dir():
        raise InvalidLaunchArguments(f"{name} {path} cannot be created: {folder} is a file")
    return path


def check_endpoint(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidLaunchArguments(f"{name} must be a string, got {value!r}")
    return value


def rank_list(text: str) -> list[int]:
    """A rank list as typed on a command line: ``"0,2"`` -> [0, 2]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated rank numbers, e.g. 0,2; got {text!r}") from None


def parse_show_ranks(text: str) -> str | list[int]:
    try:
        return text if text in ("all", "none") else rank_list(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'all', 'none' or comma-separated ranks, got {text!r}") from None


def parse_env_item(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"KEY=VALUE, got {text!r}")
    return key, value


seconds = partial(check_seconds, allow_none=True)
check_grace = partial(check_seconds, allow_none=False, allow_zero=True)
check_nproc = partial(check_int, minimum=1, allow_none=True)
check_positive = partial(check_int, minimum=1)
check_count = partial(check_int, minimum=0)


def option(
    default: D,
    help: str,
    check: Callable[[str, Any], C],
    parse: Callable[[str], Any] = str,
    *,
    live: bool = False,
    collect: Callable[[list[Any]], Any] | None = None,
) -> D | C:
    """A field of `LaunchOptions`, typed as its default or what its check keeps (see `Option`)."""
    metadata = {METADATA_KEY: dict(help=help, check=check, parse=parse, live=live, collect=collect)}
    if isinstance(default, dict | list):  # a mutable default is copied for each config
        return field(default_factory=partial(copy.copy, default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True, frozen=True)
class LaunchOptions:
    """Every option of ``launch(script, **options)``, with its default; `LaunchConfig` checks them."""

    nproc: int | None = option(
        None, "processes on this node; None: one per GPU, or 2 on the CPU", check_nproc, int, live=True
    )
    backend: str = option(
        "auto", "'auto' (nccl with GPUs, gloo without), 'gloo' or 'nccl'", one_of(BACKENDS), live=True
    )
    timeout: float | None = option(
        DEFAULT_HANG_TIMEOUT_S,
        "seconds without output before the run counts as hung",
        seconds,
        float,
        live=True,
    )
    startup_timeout: float | None = option(
        None, "seconds allowed before the first sign of life; None: timeout", seconds, float, live=True
    )
    run_dir: str | os.PathLike[str] | None = option(
        None, "where logs, metrics and the summary go; None: runs/<time>-<script>-<id>", check_path, live=True
    )
    env: dict[str, str] = option(
        {}, "extra environment variables for the workers", check_env, parse_env_item, live=True, collect=dict
    )
    show_ranks: str | int | Iterable[int] | None = option(
        "all", "ranks to echo: 'all', 'none', a rank or a list", check_show_ranks, parse_show_ranks, live=True
    )
    max_restarts: int = option(0, "torchrun's elastic restarts after a failure", check_count)
    progress: str = option(
        "auto", "'auto', 'widget', 'text' or 'off'", one_of(("auto", "widget", "text", "off"))
    )
    grace_s: float = option(5.0, "seconds between SIGTERM and SIGKILL when stopping the run", check_grace)
    nnodes: int = option(1, "nodes in a multi-node job (each node runs its own launch)", check_positive)
    node_rank: int = option(0, "this node's index, 0..nnodes-1", check_count)
    rdzv_endpoint: str | None = option(None, "'host:port' of the first node (nnodes > 1)", check_endpoint)
    rdzv_timeout: float | None = option(None, "seconds to wait for all nodes; None: 120", seconds)
    launcher: str = option(
        "torchrun", "'torchrun', or 'python': one process, no agent", one_of(("torchrun", "python"))
    )


@dataclass(frozen=True)
class Option:
    """One field of `LaunchOptions` and its metadata, as the front ends use it."""

    name: str
    default: Any
    annotation: str
    help: str  # one line: the flag's help, and the docstring's entry
    check: Callable[[str, Any], Any]
    parse: Callable[[str], Any]  # a command line's text -> a value
    live: bool = False  # also a keyword of start_ranks and a flag of %ranks start
    collect: Callable[[list[Any]], Any] | None = None  # a repeatable flag: its values -> one value


def options_of(cls: type) -> tuple[Option, ...]:
    """The options a dataclass declares with `option()`, in its fields' order."""
    return tuple(
        Option(
            f.name,
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            str(f.type),
            **f.metadata[METADATA_KEY],
        )
        for f in dataclasses.fields(cls)
        if METADATA_KEY in f.metadata
    )


OPTIONS: tuple[Option, ...] = options_of(LaunchOptions)
OPTION_NAMES = tuple(option.name for option in OPTIONS)
LIVE_OPTIONS = tuple(option for option in OPTIONS if option.live)


def options_doc(
    options: Iterable[Option], indent: str = "", defaults: Mapping[str, Any] | None = None
) -> str:
    """One docstring entry per option: ``name (default X): help.``, wrapped."""
    return "\n".join(
        textwrap.fill(
            f"{o.name} (default {(defaults or {}).get(o.name, o.default)!r}): {o.help}.",
            100,
            initial_indent=indent,
            subsequent_indent=indent + "    ",
            break_on_hyphens=False,
        )
        for o in options
    )


def with_options(
    options: Iterable[Option],
    leading: Sequence[inspect.Parameter] = (),
    *,
    positional: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """Give a ``**options`` function the signature Shift-Tab shows, and fill its docstring's ``{options}``."""
    by_name = {o.name: o for o in options}
    defaults = defaults or {}
    params = [*leading] + [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD if name in positional else inspect.Parameter.KEYWORD_ONLY,
            default=defaults.get(name, by_name[name].default),
            annotation=by_name[name].annotation,
        )
        for name in [*positional, *(n for n in by_name if n not in positional)]
    ]

    def apply(func: F) -> F:
        # a function object takes any attribute; the Callable type declares no __signature__
        func.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        func.__doc__ = re.sub(
            r"^( *)\{options\}$",
            lambda slot: options_doc(by_name.values(), slot[1], defaults),
            func.__doc__ or "",
            flags=re.MULTILINE,
        )
        return func

    return apply


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option] = OPTIONS
) -> None:
    """One flag per option, each defaulting to None: the option's own default applies."""
    for o in options:
        flag, action = "--" + o.name.replace("_", "-"), "append" if o.collect else "store"
        parser.add_argument(flag, type=o.parse, action=action, help=o.help)


def given_options(namespace: argparse.Namespace, options: Iterable[Option] = OPTIONS) -> dict[str, Any]:
    """The options a parsed command line set (the flags left at None are left out)."""
    given = [(o, getattr(namespace, o.name, None)) for o in options]
    return {o.name: o.collect(v) if o.collect else v for o, v in given if v is not None}
