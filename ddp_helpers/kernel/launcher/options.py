"""Every launcher option, declared once: a field of `LaunchOptions`, with its default, check, help and flag.

`LaunchOptions` is the one list, and a type checker reads it. From it come `LaunchConfig`'s option
fields (it subclasses `LaunchOptions`), `OPTIONS` (each field with its metadata), `launch()`'s shown
signature and the options part of its docstring, the flags of ``python -m ddp_helpers launch``, and
(for the options marked `live`) `start_ranks`' keywords and ``%ranks start``'s flags. `LaunchKeywords`
(keywords.py) writes the same names and types out for a checker to hold `launch()`'s keywords to
(tests/kernel/test_launch_options.py keeps the two equal). Adding an option is one field below, its
line in `LaunchKeywords`, and the code that acts on it (`LaunchConfig.command` or `environment`).
Nothing here imports torch: a typo is refused at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ddp_helpers.kernel.launcher.launch_checks import (
    LAUNCHERS,
    PROGRESS_CHOICES,
    check_backend,
    check_env,
    check_optional_text,
    check_path,
    check_program,
    check_show_ranks,
    int_at_least,
    one_of,
    optional_int_at_least,
    parse_env_item,
    parse_show_ranks,
    seconds,
)

D = TypeVar("D")  # an option's default
C = TypeVar("C")  # what its check keeps
F = TypeVar("F", bound=Callable[..., Any])

# No run waits silently for ever by default: a rank stuck in a collective (or in torch 2.7's gloo teardown)
# ends in LaunchTimeout with every rank's stack. Longer than any silence of the notebooks' runs, shorter than
# the 600 s a headless notebook cell gets (papermill, CI). timeout=None waits for ever.
DEFAULT_HANG_TIMEOUT_S = 300.0
METADATA_KEY = "ddp_helpers.option"  # where a field of LaunchOptions keeps its help, check and flag

# ---------------------------------------------------------------------------- the declarations


def option(
    default: D,
    help: str,
    check: Callable[[str, object], C],
    parse: Callable[[str], Any] | None = None,
    *,
    more: str = "",
    live: bool = False,
    collect: Callable[[list[Any]], Any] | None = None,
    metavar: str | None = None,
    shown_default: str = "",
) -> D | C:
    """A field of `LaunchOptions`: its default, and in its metadata what the front ends need.

    Typed so that a checker holds both the default and what the check keeps to the field's type. The
    keywords are `Option`'s fields, described there. A mutable default is copied for each config.
    """
    metadata = {
        METADATA_KEY: dict(
            help=help,
            check=check,
            parse=parse,
            more=more,
            live=live,
            collect=collect,
            metavar=metavar,
            shown_default=shown_default,
        )
    }
    if isinstance(default, dict | list):

        def copy() -> D:  # each config gets its own
            return type(default)(default)

        return field(default_factory=copy, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True, frozen=True)
class LaunchOptions:
    """Every option of a launch, with its default: what ``launch(script, **options)`` takes.

    Each field's type is what a user may pass; `LaunchConfig` (a subclass) checks the values and
    resolves the defaults that depend on the machine.
    """

    nproc: int | None = option(
        None,
        "processes on this node; None: one per visible GPU, or 2 on the CPU (1 with launcher='python')",
        optional_int_at_least(1),
        int,
        live=True,
    )
    backend: str = option(
        "auto",
        "'auto' (nccl with GPUs, gloo without), 'gloo' or 'nccl'",
        check_backend,
        str,
        more="Workers read it from DDP_BACKEND, and the device from DDP_DEVICE.",
        live=True,
    )
    timeout: float | None = option(
        DEFAULT_HANG_TIMEOUT_S,
        "seconds without progress (any output, or a metrics line) before the "
        "run counts as hung and is stopped; None waits for ever",
        seconds(allow_none=True),
        float,
        live=True,
    )
    startup_timeout: float | None = option(
        None,
        "seconds allowed before the first sign of life; None: timeout",
        seconds(allow_none=True),
        float,
        live=True,
        more="Importing torch and the rendezvous can be slow on a busy machine.",
    )
    run_dir: str | os.PathLike[str] | None = option(
        None,
        "where logs, metrics and the summary go; None: runs/<time>-<script>-<id>",
        check_path,
        str,
        live=True,
        more="A run_dir used before keeps the earlier launch's outputs under previous/.",
    )
    env: dict[str, str] = option(
        {},
        "extra environment variables for the workers (repeat the flag for each)",
        check_env,
        parse_env_item,
        live=True,
        collect=dict,
        metavar="KEY=VALUE",
    )
    max_restarts: int = option(0, "torchrun's elastic restarts after a failure", int_at_least(0), int)
    show_ranks: str | int | Iterable[int] | None = option(
        "all",
        "which ranks to echo: 'all', 'none', a rank or a list",
        check_show_ranks,
        parse_show_ranks,
        live=True,
        metavar="all|none|0,2",
        more="Every line is kept in the result and on disk either way; a flood is shown rate-limited.",
    )
    progress: str = option(
        "auto", "progress display: 'auto', 'widget', 'text' or 'off'", one_of(PROGRESS_CHOICES), str
    )
    grace_s: float = option(
        5.0,
        "seconds between SIGTERM and SIGKILL when stopping the run",
        seconds(allow_none=False, allow_zero=True),
        float,
    )
    nnodes: int = option(1, "nodes in a multi-node job (each node runs its own launch)", int_at_least(1), int)
    node_rank: int = option(
        0,
        "this node's index, 0..nnodes-1",
        int_at_least(0),
        int,
        more="With nnodes > 1 the c10d rendezvous, not node_rank, decides which node gets ranks 0..nproc-1; "
        "the result and the echo use each worker's real RANK.",
    )
    rdzv_endpoint: str | None = option(
        None,
        "'host:port' of the first node, the same on every node (needed with nnodes > 1)",
        check_optional_text,
        str,
    )
    rdzv_timeout: float | None = option(
        None,
        "seconds to wait for all nodes to join; None: 120 with nnodes > 1",
        seconds(allow_none=True),
        float,
    )
    launcher: str = option(
        "torchrun",
        "'torchrun', or 'python' for one process without torchrun's agent",
        one_of(LAUNCHERS),
        str,
        more="The script gets the environment torchrun would give a world of one (RANK, WORLD_SIZE, "
        "MASTER_PORT, the error file), with no agent or rendezvous before it starts.",
    )
    python: str = option(
        sys.executable,
        "the Python interpreter that runs torchrun and the workers",
        check_program,
        str,
        shown_default="the running interpreter",
    )


@dataclass(frozen=True)
class Option:
    """One launcher option as the front ends use it: a field of `LaunchOptions` and its metadata."""

    name: str
    default: Any
    annotation: str
    help: str  # one line: the flag's help, and the docstring's entry
    check: Callable[[str, Any], Any]
    parse: Callable[[str], Any] | None = None  # a command line's text -> a value; None: no flag
    more: str = ""  # further sentences for the docstring only
    live: bool = False  # also a keyword of start_ranks and a flag of %ranks start
    collect: Callable[[list[Any]], Any] | None = None  # a repeatable flag: its values -> one value
    metavar: str | None = None  # how the flag's value is written, where its name does not say
    shown_default: str = ""  # the docstring's words for a default that differs by machine

    @classmethod
    def of(cls, declared: dataclasses.Field[Any]) -> Option:
        """The option that a field made by `option()` declares."""
        if declared.default_factory is not dataclasses.MISSING:
            default = declared.default_factory()
        else:
            default = declared.default
        return cls(declared.name, default, str(declared.type), **declared.metadata[METADATA_KEY])

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def options_of(cls: type) -> tuple[Option, ...]:
    """The options a dataclass declares with `option()`, in its fields' order."""
    return tuple(Option.of(f) for f in dataclasses.fields(cls) if METADATA_KEY in f.metadata)


OPTIONS: tuple[Option, ...] = options_of(LaunchOptions)
OPTION_NAMES = tuple(option.name for option in OPTIONS)
LIVE_OPTIONS = tuple(option for option in OPTIONS if option.live)


def command_line_options(options: Iterable[Option] = OPTIONS) -> tuple[Option, ...]:
    """The options that have a flag (``python -m ddp_helpers launch``, ``%ranks start``)."""
    return tuple(option for option in options if option.parse is not None)


# ---------------------------------------------------------------------------- the front ends built from them


def options_signature(
    leading: list[inspect.Parameter],
    options: Iterable[Option] = OPTIONS,
    *,
    positional: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> inspect.Signature:
    """`leading` parameters, then `positional` options, then every other option as a keyword.

    A function that takes ``**options`` (one source of defaults) gets back the signature that
    Jupyter's Shift-Tab and `help()` show. `defaults` overrides an option's default for this function.
    """
    defaults = defaults or {}
    by_name = {option.name: option for option in options}
    params = list(leading)
    for name in [*positional, *(n for n in by_name if n not in positional)]:
        option = by_name[name]
        kind = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD if name in positional else inspect.Parameter.KEYWORD_ONLY
        )
        default = defaults.get(name, option.default)
        params.append(inspect.Parameter(name, kind, default=default, annotation=option.annotation))
    return inspect.Signature(params)


def options_doc(
    options: Iterable[Option] = OPTIONS, *, indent: str = "", defaults: Mapping[str, Any] | None = None
) -> str:
    """One docstring entry per option: ``name (default X): help. more``, wrapped."""
    defaults = defaults or {}
    entries = []
    for option in options:
        default = defaults.get(option.name, option.default)
        shown = (
            option.shown_default if option.shown_default and option.name not in defaults else repr(default)
        )
        text = f"{option.name} (default {shown}): {option.help}." + (f" {option.more}" if option.more else "")
        entries.append(
            textwrap.fill(
                text, 100, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False
            )
        )
    return "\n".join(entries)


def fill_doc_slot(doc: str | None, slot: str, render: Callable[[str], str]) -> str:
    """`doc` with its line ``{slot}`` replaced by ``render(indent)``, at that line's indent."""
    doc = doc or ""
    line = next((line for line in doc.splitlines() if line.strip() == "{" + slot + "}"), None)
    if line is None:
        return doc
    return doc.replace(line, render(line[: len(line) - len(line.lstrip())]))


def with_options(
    options: Iterable[Option] = OPTIONS,
    leading: list[inspect.Parameter] | None = None,
    *,
    positional: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """Give a function that takes ``**options`` their signature, and fill its docstring's ``{options}``.

    What `inspect.signature` (Shift-Tab, `help()`) shows; a type checker reads the function's own.
    """
    options = tuple(options)

    def apply(func: F) -> F:
        # a function object takes any attribute; the Callable type declares no __signature__
        func.__signature__ = options_signature(  # type: ignore[attr-defined]
            leading or [], options, positional=positional, defaults=defaults
        )
        func.__doc__ = fill_doc_slot(
            func.__doc__, "options", lambda indent: options_doc(options, indent=indent, defaults=defaults)
        )
        return func

    return apply


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option] = OPTIONS
) -> None:
    """One flag per option that has one. Each defaults to None, which leaves the option's own default."""
    for option in options:
        if option.parse is None:  # no flag
            continue
        parser.add_argument(
            option.flag,
            type=option.parse,
            action="append" if option.collect else "store",
            default=None,
            help=option.help,
            metavar=option.metavar,
        )


def given_options(
    namespace: argparse.Namespace | Mapping[str, Any], options: Iterable[Option] = OPTIONS
) -> dict[str, Any]:
    """The options a parsed command line set (the flags left at None are left out)."""
    values = namespace if isinstance(namespace, Mapping) else vars(namespace)
    given = {}
    for option in command_line_options(options):
        value = values.get(option.name)
        if value is not None:
            given[option.name] = option.collect(value) if option.collect else value
    return given


def bind_options(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Every parameter of `func`'s signature, from `args` and `kwargs` with its defaults filled in.

    Raises TypeError for an unknown keyword, as a function with those parameters written out would.
    """
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
