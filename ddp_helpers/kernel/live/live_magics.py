"""``%ranks`` and ``%%ranks``: live DDP ranks from notebook cells."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from IPython.core.displayhook import DisplayHook
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import ArgDecorator, argument, magic_arguments

from ddp_helpers.errors import InvalidLaunchArguments, RanksNotRunning
from ddp_helpers.kernel.launcher.cell_output import CellSyntaxError, as_in_editor
from ddp_helpers.kernel.launcher.options import LIVE_OPTIONS, add_flags, given_options, rank_list
from ddp_helpers.kernel.live.ranks import LiveRanks, not_running_message, shown_value, start_ranks

_current: LiveRanks | None = None


def current_ranks() -> LiveRanks:
    """The ranks that ``%ranks start`` started in this kernel."""
    if _current is None:
        raise RanksNotRunning(
            "no live ranks were started in this kernel: start them with %ranks start --nproc 2"
        )
    if not _current.alive:
        raise RanksNotRunning(not_running_message())
    return _current


# IPython leaves its argparse decorators (magic_arguments.py) unannotated. Each gives back the function it
# decorates, with what it adds to the parser recorded on it; magic_arguments(), the outermost, then builds
# the parser and sets it as the function's `parser`. Typed so here.
Magic = TypeVar("Magic", bound=Callable[..., object])


class _StartFlags(ArgDecorator):
    """``%ranks start``'s flags: one per launcher option that `start_ranks` takes (launcher/options.py)."""

    def add_to_parser(self, parser: argparse.ArgumentParser, group: argparse._ArgumentGroup | None) -> None:
        add_flags(group or parser, LIVE_OPTIONS)


class _ParsedMagic(Protocol):
    """A magic that magic_arguments() decorated: the parser it built is on the function."""

    parser: argparse.ArgumentParser

    def __call__(self, line: str, cell: str | None = None) -> LiveRanks | None: ...


def _argument(*names: str, **settings: Any) -> Callable[[Magic], Magic]:
    return argument(*names, **settings)


def _start_flags() -> Callable[[Magic], Magic]:
    return _StartFlags()


def _magic_arguments() -> Callable[[Callable[..., object]], _ParsedMagic]:
    return magic_arguments()


def _parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return rank_list(text)
    except ValueError:
        raise InvalidLaunchArguments(
            f"--rank takes comma-separated rank numbers, e.g. 0,1; got {text!r}"
        ) from None


@magics_class
class RanksMagics(Magics):
    @_magic_arguments()
    @_argument("action", nargs="?", default=None, help="line form: start, stop, restart, status or where")
    @_start_flags()  # --timeout also sets a %%ranks cell's own timeout
    @_argument("--rank", default=None, help="cell form: run on these ranks only, e.g. 0 or 0,2")
    @_argument("--name", default="ranks", help="the notebook variable that holds the ranks")
    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None) -> LiveRanks | None:
        """Start, stop and use live DDP ranks; see `ddp_helpers.start_ranks`."""
        # shell quoting, as in a terminal: --run-dir 'my runs' is one argument
        opts = self.ranks.parser.parse_args(shlex.split(line))
        if cell is None:
            return self._line(opts)
        if opts.action is not None:
            raise InvalidLaunchArguments(f"%%ranks takes options only (e.g. --rank 0), not {opts.action!r}")
        ranks = current_ranks()
        timeout = ... if opts.timeout is None else opts.timeout
        try:
            results = ranks.run(
                as_in_editor(cell),
                ranks=_parse_ranks(opts.rank),
                timeout=timeout,
            )
        except SyntaxError as error:
            raise CellSyntaxError(error) from None
        quiet = DisplayHook.semicolon_at_end_of_expression(cell)  # `x;` shows no Out, as in IPython
        for rank, value in sorted(results.items()):
            if value is not None and not quiet:
                print(f"[rank {rank}] Out: {shown_value(value)}")
        assert self.shell is not None  # a registered magic has its shell
        self.shell.user_ns["_ranks_out"] = results
        return None

    def _line(self, opts: argparse.Namespace) -> LiveRanks | None:
        global _current
        if opts.action == "start":
            replaced = ""
            if _current is not None and _current.alive:
                _current.shutdown()  # one set of live ranks per kernel: a second start replaces the first
                replaced = (
                    f"stopped the {_current.world_size} live rank(s) that were running: every variable "
                    "they held is gone. "
                )
            # every rank imports torch and joins the group first: seconds of silence without this line
            print("starting the live ranks (each imports torch and joins the process group)...", flush=True)
            _current = start_ranks(**given_options(opts, LIVE_OPTIONS))
            assert self.shell is not None  # a registered magic has its shell
            self.shell.user_ns[opts.name] = _current
            print(
                f"{replaced}{_current.world_size} live rank(s) on {_current.backend}, bound to `{opts.name}`; "
                f"logs in {_current.run_dir}/logs"
            )
            return None
        if opts.action == "stop":
            if _current is None or not _current.alive:
                print("no live ranks were running: nothing to stop")
                return None
            _current.shutdown()
            print("every rank has exited")
            return None
        if opts.action == "restart":
            if _current is None:
                raise InvalidLaunchArguments("no live ranks to restart: start them with %ranks start")
            _current.restart()
            print(f"{_current.world_size} fresh rank(s) started")
            return None
        if opts.action in (None, "status"):
            return _current
        if opts.action == "where":
            print(current_ranks().where())
            return None
        raise InvalidLaunchArguments(
            f"%ranks takes start, stop, restart, status or where, not {opts.action!r}"
        )


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(RanksMagics)
