"""``%ranks start|stop|restart|status|where`` and ``%%ranks [--rank 0,2]``: live DDP ranks from notebook cells."""

from __future__ import annotations

import argparse
import shlex

from IPython.core.displayhook import DisplayHook
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from ddp_helpers.errors import InvalidLaunchArguments, RanksNotRunning
from ddp_helpers.kernel.launcher.cell_output import CellSyntaxError
from ddp_helpers.kernel.launcher.options import LIVE_OPTIONS, add_flags, given_options, rank_list
from ddp_helpers.kernel.live.ranks import NOT_RUNNING, LiveRanks, start_ranks
from ddp_helpers.kernel.live.results import shown_value

_current: LiveRanks | None = None

# a bad flag raises IPython's UsageError; --timeout also sets a %%ranks cell's own timeout
PARSER = MagicArgumentParser(prog="%ranks", description="Start, stop and use live DDP ranks (start_ranks).")
PARSER.add_argument(
    "action", nargs="?", default=None, help="line form: start, stop, restart, status or where"
)
add_flags(PARSER, LIVE_OPTIONS)
PARSER.add_argument("--rank", type=rank_list, help="cell form: run on these ranks only, e.g. 0 or 0,2")
PARSER.add_argument("--name", default="ranks", help="the notebook variable that holds the ranks")


def current_ranks() -> LiveRanks:
    """The ranks that ``%ranks start`` started in this kernel."""
    if _current is None:
        raise RanksNotRunning(
            "no live ranks were started in this kernel: start them with %ranks start --nproc 2"
        )
    if not _current.alive:
        raise RanksNotRunning(NOT_RUNNING)
    return _current


@magics_class
class RanksMagics(Magics):
    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None) -> LiveRanks | None:
        """Start, stop and use live DDP ranks; see `ddp_helpers.start_ranks` and ``%ranks --help``."""
        opts = PARSER.parse_args(shlex.split(line))  # shell quoting: --run-dir 'my runs' is one argument
        assert self.shell is not None  # a registered magic has its shell
        if cell is None:
            return self._line(opts)
        if opts.action is not None:
            raise InvalidLaunchArguments(f"%%ranks takes options only (e.g. --rank 0), not {opts.action!r}")
        timeout = ... if opts.timeout is None else opts.timeout
        try:  # an empty line in place of the magic's: the cell's line numbers match the editor's
            results = current_ranks().run("\n" + cell, ranks=opts.rank, timeout=timeout)
        except SyntaxError as error:
            raise CellSyntaxError(error) from None
        if not DisplayHook.semicolon_at_end_of_expression(cell):  # `x;` shows no Out, as in IPython
            for rank, value in sorted(results.items()):
                if value is not None:
                    print(f"[rank {rank}] Out: {shown_value(value)}")
        self.shell.user_ns["_ranks_out"] = results
        return None

    def _line(self, opts: argparse.Namespace) -> LiveRanks | None:
        global _current
        if opts.action in (None, "status"):
            return _current
        if opts.action == "where":
            print(current_ranks().where())
        elif opts.action == "start":
            replaced = ""
            if _current is not None and _current.alive:
                _current.shutdown()  # one set of live ranks per kernel: a second start replaces the first
                replaced = f"stopped the {_current.world_size} live rank(s) that were running: every variable they held is gone. "
            # every rank imports torch and joins the group first: seconds of silence without this line
            print("starting the live ranks (each imports torch and joins the process group)...", flush=True)
            _current = start_ranks(**given_options(opts, LIVE_OPTIONS))
            assert self.shell is not None
            self.shell.user_ns[opts.name] = _current
            print(
                f"{replaced}{_current.world_size} live rank(s) on {_current.backend}, bound to `{opts.name}`; "
                f"logs in {_current.run_dir}/logs"
            )
        elif opts.action == "stop":
            if _current is None or not _current.alive:
                print("no live ranks were running: nothing to stop")
            else:
                _current.shutdown()
                print("every rank has exited")
        elif opts.action == "restart":
            if _current is None:
                raise InvalidLaunchArguments("no live ranks to restart: start them with %ranks start")
            print(f"{_current.restart().world_size} fresh rank(s) started")
        else:
            raise InvalidLaunchArguments(
                f"%ranks takes start, stop, restart, status or where, not {opts.action!r}"
            )
        return None
