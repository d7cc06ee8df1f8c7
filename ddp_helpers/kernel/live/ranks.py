"""Live ranks: DDP processes that stay up between notebook cells."""

from __future__ import annotations

import atexit
import os
import pickle
import re
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import EllipsisType
from typing import Any, Unpack

from ddp_helpers.errors import InvalidLaunchArguments, RankError, RanksNotRunning
from ddp_helpers.kernel.launcher.config import LaunchConfig, default_run_dir, make_config
from ddp_helpers.kernel.launcher.options import (
    LIVE_OPTIONS,
    LiveKeywords,
    bind_options,
    check_rank_list,
    check_seconds,
    with_options,
)
from ddp_helpers.kernel.live import recovery
from ddp_helpers.kernel.live.results import RankResults, cell_results, check_syntax, gathered, shown_value
from ddp_helpers.kernel.live.session import RANK_SERVER, CellLog, Session
from ddp_helpers.rank.live_protocol import Error, Exited, Gather, Push, Reply, Request, Run
from ddp_helpers.rank.rank_call import PAYLOAD, OnRank

__all__ = ["LiveRanks", "OnRank", "RankResults", "shown_value", "start_ranks"]

STARTUP_TIMEOUT_S = 180.0  # importing torch and the rendezvous, on a loaded 2-core machine
# after a rank raised, how long the others get to finish the cell by themselves: a rank that raised
# before a collective leaves the others waiting in it until the group's timeout (30 minutes by default)
PEER_FAILED_WAIT_S = 3.0


def not_running_message() -> str:
    """One story wherever stopped ranks are used: what happened, and the advice that works."""
    return (
        "the live ranks are not running (stopped after a failure, a hang or an interrupt, or by %ranks stop), "
        f"and the variables they held are gone: {recovery.RESTART_HINT}"
    )


class LiveRanks:
    """DDP ranks that keep running between cells. Make them with `start_ranks`."""

    def __init__(self, config: LaunchConfig, timeout: float | None, startup_timeout: float) -> None:
        self._config = config
        self.timeout = timeout
        self._startup_timeout = startup_timeout
        self._base_run_dir = config.out_dir
        self._starts = 0
        self._cells = CellLog()
        self._session: Session | None = None
        self._start()
        atexit.register(_shutdown_quietly, weakref.ref(self))

    # ------------------------------------------------------------------ start and stop
    @property
    def world_size(self) -> int:
        return self._config.local_world_size

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def run_dir(self) -> Path:
        """Where this start's logs are (``logs/``), with the per-rank stack dumps (``stacks/``)."""
        return self._config.out_dir

    @property
    def alive(self) -> bool:
        return self._session is not None and self._session.alive

    @property
    def pids(self) -> dict[int, int]:
        """Each running rank's process id, ``{rank: pid}`` (empty once the ranks are stopped)."""
        return {} if self._session is None else {r: link.pid for r, link in self._session.links.items()}

    def _start(self) -> None:
        if self._starts:
            self._config = self._config.derive(out_dir=self._base_run_dir / f"restart-{self._starts}")
        self._starts += 1
        self._session = None
        self._session = Session(self._config, self._startup_timeout)

    def shutdown(self) -> None:
        """Ask every rank to exit, then make sure that every process is gone."""
        if self._session is not None and not self._session.closed:
            self._session.shutdown()

    def restart(self) -> LiveRanks:
        """Stop the ranks, whatever their state, and start fresh ones (new namespaces, new group)."""
        if self._session is not None:
            self._session.stop()
        self._start()
        return self

    def __enter__(self) -> LiveRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return (
            f"LiveRanks({state}, world_size={self.world_size}, backend={self.backend!r}, "
            f"logs='{self._config.log_dir}')"
        )

    # ------------------------------------------------------------------ the public calls
    def run(
        self,
        code: str,
        ranks: Iterable[int] | int | None = None,
        timeout: float | None | EllipsisType = ...,
    ) -> RankResults:
        """Run `code` on `ranks` (default: every rank) and wait until each has finished it."""
        if not isinstance(code, str):
            raise InvalidLaunchArguments(f"code must be a string, got {type(code).__name__}")
        check_syntax(code)  # a syntax error is reported here, before anything is sent
        targets = self._targets(ranks)
        warn_partial_collective(code, targets, self.world_size)
        message = Run(self._cells.new(code), code)
        started = time.monotonic()
        try:
            replies = self._request(message, targets, timeout)
        except RankError as error:
            if not self.alive:  # some ranks raised, the rest were stuck waiting for them: fresh ranks
                self.restart()
                error.args = (f"{error}\nFresh ranks were started (every variable they held is gone).",)
            raise
        results = cell_results(replies)
        results.wall_s = time.monotonic() - started
        return results

    def call(
        self,
        target: str,
        /,
        *args: Any,
        ranks: Iterable[int] | int | None = None,
        timeout: float | None | EllipsisType = ...,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> RankResults:
        """Call the function named `target` on `ranks` (default: every rank) with these arguments, and
        return each rank's return value: ``ranks.call("train.main", argv)``."""
        if not isinstance(target, str) or not all(part.isidentifier() for part in target.split(".")):
            raise InvalidLaunchArguments(f"call takes a function's dotted name, got {target!r}")
        extra = dict(environ or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
            raise InvalidLaunchArguments(f"environ must map names to strings, got {environ!r}")
        self._targets(ranks)  # bad ranks are refused before anything is sent
        self.push(**{PAYLOAD: (target, args, kwargs, extra)})
        code = f"__import__('ddp_helpers.rank.rank_call', fromlist=['invoke']).invoke(globals())  # {target}"
        return self.run(code, ranks=ranks, timeout=timeout)

    def where(self) -> str:
        """Every rank's Python stack now, without stopping any (the cell's lines shown with its frames)."""
        if self._session is None or not self.alive:
            raise RanksNotRunning(not_running_message())
        return recovery.where(self._session, self._cells)

    def gather(self, name: str, ranks: Iterable[int] | int | None = None) -> list[Any]:
        """The value bound to `name` on each rank, in rank order (tensors moved to the CPU)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidLaunchArguments(f"gather takes a variable name, got {name!r}")
        targets = self._targets(ranks)
        replies = self._request(Gather(self._cells.new(""), name), targets, ...)
        return gathered(name, replies, targets)

    def push(self, **values: Any) -> None:
        """Bind each keyword to the same value on every rank, e.g. ``ranks.push(lr=0.1)``."""
        if not values:
            raise InvalidLaunchArguments("push takes keyword arguments, e.g. ranks.push(lr=0.1)")
        try:
            data = pickle.dumps(values)
        except Exception as error:
            raise InvalidLaunchArguments(f"push: the values cannot be pickled: {error}") from None
        targets = self._targets(None)
        self._request(Push(self._cells.new(""), data), targets, ...)

    def import_file(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        """Import the Python file at `path` on every rank as module `name` (default: the file's stem),
        bound to `name` in each rank's namespace: e.g. a worker, to call its ``main(argv)`` there."""
        file = Path(path).resolve()
        name = file.stem if name is None else name
        if not file.is_file() or file.suffix != ".py":
            raise InvalidLaunchArguments(f"import_file takes a .py file; {str(file)!r} is not one")
        if not name.isidentifier():
            raise InvalidLaunchArguments(f"import_file: {name!r} is not a module name")
        self.run(
            "import importlib.util as _util, sys as _sys\n"
            f"_spec = _util.spec_from_file_location({name!r}, {str(file)!r})\n"
            f"{name} = _sys.modules[{name!r}] = _util.module_from_spec(_spec)\n"
            f"_spec.loader.exec_module({name})\n"
            "del _util, _sys, _spec"
        )

    # ------------------------------------------------------------------ internals
    def _request(
        self,
        message: Run | Gather | Push,
        targets: list[int],
        timeout: float | None | EllipsisType,
    ) -> dict[int, Reply]:
        """Send `message` to `targets` (checked by `_targets`); `timeout` ``...``: the ranks' own."""
        if self._session is None:
            raise RanksNotRunning(not_running_message())
        seconds = check_seconds("timeout", self.timeout if timeout is ... else timeout, allow_none=True)
        return request(self._session, self._cells, message, targets, seconds)

    def _targets(self, ranks: Iterable[int] | int | None) -> list[int]:
        session = self._session
        if session is None or session.closed or not session.links:
            raise RanksNotRunning(not_running_message())
        if ranks is None:
            return list(session.links)
        chosen = check_rank_list(ranks)  # the launcher's one reading of "a rank, or some ranks"
        if not chosen or any(r not in session.links for r in chosen):
            raise InvalidLaunchArguments(
                f"ranks must be among 0..{self.world_size - 1} (world size {self.world_size}), got {ranks!r}"
            )
        return sorted(set(chosen))


def request(
    session: Session,
    cells: CellLog,
    message: Request,
    targets: list[int],
    timeout: float | None,
) -> dict[int, Reply]:
    """Send `message` to `targets` and return each rank's reply once all have replied."""
    session.begin_cell(after_cell=cells.last_sent)
    cells.last_sent = message.cell_id
    session.send(targets, message)
    pending = set(targets)
    replies: dict[int, Reply] = {}
    started = time.monotonic()
    failed_at: float | None = None  # when the first rank's error came back

    def watch() -> None:  # between two waits: echo, and notice a dead torchrun or a silent rank
        session.follow()
        if session.agent_exit_code() is not None:
            raise recovery.died(session, None)
        if timeout is not None and pending:
            now = time.monotonic()
            stuck = [r for r in sorted(pending) if now - session.last_heard(r, started) > timeout]
            if stuck:
                raise recovery.hung(session, cells, stuck, sorted(set(replies)), timeout)
        if failed_at is not None and pending and time.monotonic() - failed_at > PEER_FAILED_WAIT_S:
            raise recovery.peer_failed(session, cells, pending, replies)

    try:
        for rank, reply in session.replies(pending, between=watch):
            if reply is None:
                raise recovery.died(session, rank)
            if isinstance(reply, Exited):  # the cell called os._exit(code)
                raise recovery.died(session, rank, exitcode=reply.code)
            replies[rank] = reply
            if isinstance(reply, Error) and failed_at is None:
                failed_at = time.monotonic()
    except KeyboardInterrupt:
        pending.difference_update(replies)  # a reply taken just before the interrupt is not pending
        raise recovery.interrupted(session, cells, pending, replies) from None
    session.end_cell()
    return replies


_COLLECTIVE = re.compile(
    r"\b(?:dist|distributed)\.(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce_scatter\w*|reduce"
    r"|gather|scatter|all_to_all\w*|monitored_barrier)\s*\("
)


def warn_partial_collective(code: str, targets: list[int], world_size: int) -> None:
    """A cell on some ranks only that calls a collective waits for ranks that never join it: say so first."""
    if len(targets) == world_size:
        return
    called = sorted(set(_COLLECTIVE.findall(code)))
    if called:
        others = sorted(set(range(world_size)) - set(targets))
        print(
            f"warning: this cell runs on rank(s) {', '.join(map(str, targets))} only, but calls "
            f"{', '.join(f'dist.{c}' for c in called)}: rank(s) {', '.join(map(str, others))} will not join, "
            "so it waits until the cell's timeout (then each rank's stack is shown). Run it on every rank.",
            flush=True,
        )


def _shutdown_quietly(ref: weakref.ref[LiveRanks]) -> None:
    ranks = ref()
    if ranks is not None:
        try:
            ranks.shutdown()
        except Exception:
            pass


# start_ranks takes the launcher's options marked `live` (see launcher/options.py); these four stay
# positional as they always were, and the ranks wait longer to start than one script does
@with_options(
    LIVE_OPTIONS,
    positional=("nproc", "backend", "timeout", "env"),
    defaults={"startup_timeout": STARTUP_TIMEOUT_S},
)
def start_ranks(*args: Any, **options: Unpack[LiveKeywords]) -> LiveRanks:
    """Start `nproc` DDP ranks under torchrun that stay up between cells.

    Returns once every rank has run ``init_process_group`` (nccl with one GPU per rank where GPUs
    exist, gloo on the CPU, as `launch` chooses). Each rank's namespace starts with ``torch``,
    ``dist``, ``nn``, ``rank``, ``local_rank``, ``world_size`` and ``device``. `timeout` is the
    default of each `run`: a cell whose ranks print nothing for that long counts as hung;
    `startup_timeout` (a number here, not None) is for every rank to import torch and join the
    group; the logs go to
    `run_dir`, by default ``runs/<time>-ranks-<id>``.

    Options (each as `launch` takes it):
        {options}
    """
    given = bind_options(start_ranks, args, options)
    timeout = check_seconds("timeout", given.pop("timeout"), allow_none=True)
    startup_timeout = check_seconds("startup_timeout", given.pop("startup_timeout"), allow_none=False)
    if given["run_dir"] is None:
        given["run_dir"] = default_run_dir("ranks")
    # the run's own timeout stays off: a rank that waits for its next cell is not hung
    config = make_config(RANK_SERVER, (), **given, timeout=None, max_restarts=0, grace_s=3.0)
    return LiveRanks(config, timeout=timeout, startup_timeout=startup_timeout)
