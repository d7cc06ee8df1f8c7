"""Live ranks: DDP processes that stay up between notebook cells (`start_ranks`, `LiveRanks`). Each rank runs
rank/live_server.py under torchrun and connects back over an authenticated Unix socket; logs, errors, hangs
(with each stuck rank's stack) and deaths are the launcher's, and leave the ranks usable or stopped."""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import pickle
import re
import secrets
import select
import shutil
import signal
import socket
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path
from types import EllipsisType
from typing import Any

import psutil

from ddp_helpers.errors import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchInterrupted,
    LaunchTimeout,
    RankError,
    RanksNotRunning,
    WorkerFailed,
)
from ddp_helpers.kernel.launcher.config import LaunchConfig, default_run_dir, make_config
from ddp_helpers.kernel.launcher.diagnosis import rank_stderr, stderr_tail
from ddp_helpers.kernel.launcher.options import LIVE_OPTIONS, check_rank_list, check_seconds, with_options
from ddp_helpers.kernel.launcher.processes import ProcessTree, RunProcess, start_run, stop_run, wait_for_exit
from ddp_helpers.kernel.launcher.run_follower import RunFollower
from ddp_helpers.kernel.live.results import RankResults, cell_results, check_syntax, failure_text, gathered
from ddp_helpers.rank import stack_dumps
from ddp_helpers.rank.live_protocol import ADDRESS_ENV, AUTHKEY_ENV, Error, Exited, Reply, Run, Value
from ddp_helpers.rank.rank_call import PAYLOAD, OnRank
from ddp_helpers.run_contract import STDERR_LOG

__all__ = ["LiveRanks", "OnRank", "RankResults", "start_ranks"]

STARTUP_TIMEOUT_S = 180.0  # importing torch and the rendezvous, on a loaded 2-core machine
# after a rank raised, how long the others get to finish the cell by themselves: a rank that raised
# before a collective leaves the others waiting in it until the group's timeout (30 minutes by default)
PEER_FAILED_WAIT_S = 3.0
POLL_S = 0.02
INTERRUPT_WAIT_S = 5.0  # how long an interrupted rank gets to come back before the ranks are stopped
CHECK_TIMEOUT_S = 10.0  # the barrier that tells whether an interrupt left the process group usable
EXIT_REPORT_WAIT_S = 1.0  # torchrun polls its workers every 0.1 s: a failure is reported well within this
RESTART_HINT = "`%ranks restart` (or `ranks.restart()`) starts them afresh, with the same options."
RANK_SERVER = Path(__file__).resolve().parents[2] / "rank" / "live_server.py"  # what each rank runs


NOT_RUNNING = (
    "the live ranks are not running (stopped after a failure, a hang or an interrupt, or by %ranks stop), "
    f"and the variables they held are gone: {RESTART_HINT}"
)


def receive(
    conns: Mapping[int, Connection],
    pending: set[int],
    deadline: float | None = None,
    between: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Reply | None]]:
    """Each reply from the ranks in `pending` as it comes, ``(rank, reply)``; None: the connection closed."""
    # a rank leaves `pending` once the caller took its reply; `between` runs after each wait (it may raise)
    while pending and (deadline is None or time.monotonic() < deadline):
        by_conn = {conns[rank]: rank for rank in pending}
        ready = wait(list(by_conn), timeout=POLL_S)
        for rank in [rank for conn, rank in by_conn.items() if conn in ready]:
            try:
                reply = conns[rank].recv()
            except (EOFError, OSError):
                reply = None
            yield rank, reply
            pending.discard(rank)
        if between is not None:
            between()


class LiveRanks:
    """DDP ranks that keep running between cells. Make them with `start_ranks`."""

    def __init__(self, config: LaunchConfig, timeout: float | None, startup_timeout: float) -> None:
        self.config = config
        self.timeout = timeout
        self._startup_timeout = startup_timeout
        self._base_run_dir = config.out_dir
        self._starts = 0
        self.sources: dict[int, str] = {}  # each request's code by cell id, across restarts: a stack's lines
        self.last_sent = 0
        self.conns: dict[int, Connection] = {}
        self.pids: dict[int, int] = {}  # each running rank's process id (empty once stopped)
        self.proc: RunProcess | None = None
        self.stderr_at: dict[int, int] = {}  # each rank's stderr.log size when the cell began
        self.closed = True
        self._start()
        atexit.register(_shutdown_quietly, weakref.ref(self))

    @property
    def world_size(self) -> int:
        return self.config.local_world_size

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def run_dir(self) -> Path:
        """Where this start's logs are (``logs/``), with the per-rank stack dumps (``stacks/``)."""
        return self.config.out_dir

    @property
    def alive(self) -> bool:
        return not self.closed and self.proc is not None and self.proc.poll() is None

    def agent_exit_code(self) -> int | None:
        """torchrun's exit code (negative: the signal that ended it), or None while it runs or before."""
        return None if self.proc is None else self.proc.poll()

    def __enter__(self) -> LiveRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return (
            f"LiveRanks({state}, world_size={self.world_size}, backend={self.backend!r}, "
            f"logs='{self.config.log_dir}')"
        )

    # ------------------------------------------------------------------ start and stop
    def _start(self) -> None:
        if self._starts:
            self.config = self.config.derive(out_dir=self._base_run_dir / f"restart-{self._starts}")
        self._starts += 1
        self.closed, self.proc = False, None
        self.follower = RunFollower(self.config)
        # live ranks have no result.logs: the held-back note names the files
        self.follower.echo.kept_in = (
            f"each rank's stdout.log and stderr.log under {self.config.log_dir}/*/attempt_0/<rank>/"
        )
        folder = Path(tempfile.mkdtemp(prefix="ddp-ranks-"))  # 0700: only this user
        address, authkey = folder / "control.sock", secrets.token_bytes(32)
        try:
            listener = self._listen(address)
            try:
                # the address and key in the ranks' environment only, never in self.config; in a session
                # of its own, torchrun is never signalled by the kernel's own Ctrl-C
                env = {**self.config.env, ADDRESS_ENV: str(address), AUTHKEY_ENV: authkey.hex()}
                self.proc = start_run(self.config.derive(env=env))
                self.tree = ProcessTree(self.proc.pid)
                self._accept(listener, authkey)
            finally:
                listener.close()
        except BaseException:
            self.stop()
            raise
        finally:
            # every rank has connected (or none will): a killed kernel could not remove the folder later
            shutil.rmtree(folder, ignore_errors=True)

    def _listen(self, address: Path) -> socket.socket:
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(address))
        except OSError as err:
            listener.close()
            size = len(os.fsencode(str(address)))
            hint = f" (its path has {size} bytes; Linux allows 107: set TMPDIR to a shorter folder)"
            raise OSError(
                f"live ranks cannot listen at {address}: {err}{hint if size > 107 else ''}"
            ) from err
        listener.listen(self.config.local_world_size)
        return listener

    def _accept(self, listener: socket.socket, authkey: bytes) -> None:
        """Wait until every rank has joined the process group and connected back, proving the key."""
        nproc = self.config.local_world_size
        deadline = time.monotonic() + self._startup_timeout
        try:
            while len(self.conns) < nproc:
                self.follow()
                returncode = self.agent_exit_code()
                if returncode is not None:
                    raise self.follower.failure(returncode)
                if time.monotonic() > deadline:
                    raise LaunchTimeout(
                        f"the ranks did not start within {self._startup_timeout:g}s: "
                        f"{len(self.conns)} of {nproc} connected. Logs: {self.config.log_dir}",
                        silent_ranks=sorted(set(range(nproc)) - set(self.conns)),
                        run_dir=str(self.config.out_dir),
                    )
                if select.select([listener], [], [], 0.1)[0]:
                    conn = Connection(listener.accept()[0].detach())
                    deliver_challenge(conn, authkey)
                    answer_challenge(conn, authkey)
                    rank, self.pids[rank] = conn.recv()
                    self.conns[rank] = conn
        except KeyboardInterrupt:
            raise LaunchInterrupted(
                "interrupted while the ranks started; every process was stopped"
            ) from None
        self.conns = dict(sorted(self.conns.items()))
        self.follow(final=True)

    def shutdown(self) -> None:
        """Ask every rank to exit, then make sure that every process is gone."""
        if self.closed:
            return
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.send(None)
        if self.proc is not None:
            wait_for_exit(self.proc, self.config.grace_s + 5)
            self.follow(final=True)
        self.stop()

    def stop(self) -> None:
        """Stop every process of the ranks (the launcher's `stop_run`) and close the connections."""
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.close()
        self.conns, self.pids = {}, {}
        if self.proc is not None:
            stop_run(self.tree, self.proc, self.config.grace_s)
        self.closed = True

    def restart(self) -> LiveRanks:
        """Stop the ranks, whatever their state, and start fresh ones (new namespaces, new group)."""
        self.stop()
        self._start()
        return self

    # ------------------------------------------------------------------ the public calls
    def run(
        self, code: str, ranks: Iterable[int] | int | None = None, timeout: float | None | EllipsisType = ...
    ) -> RankResults:
        """Run `code` on `ranks` (default: every rank); each rank's value of its last expression.

        Raises `RankError` if it raised on a rank, `LaunchTimeout` if a rank still in the cell printed
        nothing for `timeout` seconds, `WorkerFailed` if a rank died, `LaunchInterrupted` on Ctrl-C."""
        if not isinstance(code, str):
            raise InvalidLaunchArguments(f"code must be a string, got {type(code).__name__}")
        check_syntax(code)  # a syntax error is reported here, before anything is sent
        targets = self._targets(ranks)
        warn_partial_collective(code, targets, self.world_size)
        started = time.monotonic()
        try:
            replies = self._request(code, targets, timeout)
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
        """Call the function named `target` on `ranks` with these (pickled) arguments; each return value.

        `target`: a dotted name in each rank's namespace or an importable one; `OnRank("mesh")` stands
        for the rank's own ``mesh``; `environ`: variables set on the ranks for the call only."""
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
        """Every rank's Python stack now, without stopping any; it sends nothing, so a second thread may ask."""
        if not self.alive:
            raise RanksNotRunning(NOT_RUNNING)
        parts = []  # a rank with no cell frame is between cells
        for rank, stack in sorted(read_stacks(self, sorted(self.pids)).items()):
            if 'File "<cell ' not in stack:
                parts.append(f"rank {rank}: between cells (waiting for the next one)")
            else:
                parts.append(f"rank {rank}, running (most recent call first):\n{stack}")
        return "\n\n".join(parts) or "no rank answered"

    def gather(self, name: str, ranks: Iterable[int] | int | None = None) -> list[Any]:
        """The value bound to `name` on each rank, in rank order (tensors moved to the CPU).

        Raises `NameError` where it is unbound, `ValueNotReturned` where a value cannot travel."""
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidLaunchArguments(f"gather takes a variable name, got {name!r}")
        targets = self._targets(ranks)
        return gathered(name, self._request(name, targets, ...), targets)

    def push(self, **values: Any) -> None:
        """Bind each keyword to the same value on every rank, e.g. ``ranks.push(lr=0.1)``."""
        if not values:
            raise InvalidLaunchArguments("push takes keyword arguments, e.g. ranks.push(lr=0.1)")
        try:
            data = pickle.dumps(values)
        except Exception as error:
            raise InvalidLaunchArguments(f"push: the values cannot be pickled: {error}") from None
        self._request("", self._targets(None), ..., data)

    def import_file(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        """Import the .py file at `path` on every rank as module `name` (default: its stem), as `import` would."""
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

    # ------------------------------------------------------------------ one request, every reply
    def new_cell(self, code: str) -> int:
        """A new request's id; its code is kept, so that a stuck rank's stack shows the line it waits on."""
        self.sources[len(self.sources) + 1] = code
        return len(self.sources)

    def _targets(self, ranks: Iterable[int] | int | None) -> list[int]:
        if self.closed or not self.conns:
            raise RanksNotRunning(NOT_RUNNING)
        if ranks is None:
            return list(self.conns)
        chosen = check_rank_list(ranks)  # the launcher's one reading of "a rank, or some ranks"
        if not chosen or any(r not in self.conns for r in chosen):
            raise InvalidLaunchArguments(
                f"ranks must be among 0..{self.world_size - 1} (world size {self.world_size}), got {ranks!r}"
            )
        return sorted(set(chosen))

    def _request(
        self, code: str, targets: list[int], timeout: float | None | EllipsisType, values: bytes | None = None
    ) -> dict[int, Reply]:
        """Send `code` to `targets`; each rank's reply, or what ended the cell early as an error."""
        seconds = check_seconds("timeout", self.timeout if timeout is ... else timeout, allow_none=True)
        message = Run(self.new_cell(code), code, values)
        self.begin_cell(after_cell=self.last_sent)
        self.last_sent = message.cell_id
        self.send(targets, message)
        pending = set(targets)
        replies: dict[int, Reply] = {}
        started = time.monotonic()
        failed_at: float | None = None  # when the first rank's error came back

        def watch() -> None:  # between two waits: echo, and notice a dead torchrun or a silent rank
            self.follow()
            if self.agent_exit_code() is not None:
                raise died(self, None)
            if seconds is not None and pending:
                now, ranks = time.monotonic(), self.follower.ranks  # silent since the cell began: stuck
                heard = {r: ranks[r].last_heard or started if r in ranks else started for r in pending}
                stuck = [r for r in sorted(pending) if now - max(heard[r], started) > seconds]
                if stuck:
                    raise hung(self, stuck, sorted(set(replies)), seconds)
            if failed_at is not None and pending and time.monotonic() - failed_at > PEER_FAILED_WAIT_S:
                raise peer_failed(self, pending, replies)

        try:
            for rank, reply in receive(self.conns, pending, between=watch):
                if reply is None:
                    raise died(self, rank)
                if isinstance(reply, Exited):  # the cell called os._exit(code)
                    raise died(self, rank, exitcode=reply.code)
                replies[rank] = reply
                if isinstance(reply, Error) and failed_at is None:
                    failed_at = time.monotonic()
        except KeyboardInterrupt:
            pending.difference_update(replies)  # a reply taken just before the interrupt is not pending
            raise interrupted(self, pending, replies) from None
        self.follow(final=True)  # every line the cell printed is on disk by now: show the rest
        self.follower.echo.close()  # and what was held back, with its count: this cell's output ends here
        return replies

    def send(self, ranks: Iterable[int], message: Run) -> None:
        for rank in ranks:
            self.conns[rank].send(message)

    def follow(self, final: bool = False) -> None:
        """Echo what the ranks wrote to their logs since the last look (`final`: to the end of each file)."""
        self.follower.poll_files(final=final)

    def begin_cell(self, after_cell: int) -> None:
        """Close the previous cell's output (lines printed between cells first, labelled) and start this one's."""
        self.follower.label_note = f" (after cell {after_cell})" if after_cell else ""
        try:
            self.follow(final=True)
        finally:
            self.follower.label_note = ""
        self.follower.echo.close()
        self.follower.echo.held_back = 0  # each cell has its own held-back count
        self.stderr_at = {r: self._stderr_size(r) for r in self.conns}  # a death is explained by *this* cell

    def _stderr_size(self, rank: int) -> int:
        path = self.follower.tail.rank_file(rank, STDERR_LOG)
        try:
            return path.stat().st_size if path is not None else 0
        except OSError:
            return 0


_COLLECTIVE = re.compile(
    r"\b(?:dist|distributed)\.(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce_scatter\w*|reduce"
    r"|gather|scatter|all_to_all\w*|monitored_barrier)\s*\("
)


def warn_partial_collective(code: str, targets: list[int], world_size: int) -> None:
    """A cell on some ranks only that calls a collective waits for ranks that never join it: say so first."""
    called = sorted(set(_COLLECTIVE.findall(code)))
    if len(targets) == world_size or not called:
        return
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
        with contextlib.suppress(Exception):
            ranks.shutdown()


# ------------------------------------------------------------------ when a cell does not end by itself
def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def interrupted(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> LaunchInterrupted:
    """Ctrl-C in the kernel: interrupt the ranks still in the cell, keep them if the group survived."""
    if not interrupt(ranks, pending, replies):
        ranks.stop()
        return LaunchInterrupted(
            f"interrupted: rank(s) {_listed(sorted(pending))} did not return from the cell within "
            f"{INTERRUPT_WAIT_S:g}s (a rank blocked inside a collective cannot be interrupted), so every "
            f"rank was stopped. {RESTART_HINT}"
        )
    return LaunchInterrupted(check_group(ranks, "interrupted: every rank stopped the cell"))


def interrupt(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> bool:
    """SIGINT the ranks in `pending` (never torchrun's agent); True if each came back in INTERRUPT_WAIT_S."""
    for rank in pending:
        try:
            os.kill(ranks.pids[rank], signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    for rank, reply in receive(ranks.conns, pending, deadline, ranks.follow):
        if reply is None:
            return False
        replies[rank] = reply
    ranks.follow(final=True)
    return not pending


def check_group(ranks: LiveRanks, what: str) -> str:
    """A barrier with a deadline: after an interrupt, is the process group still usable?"""
    ranks.send(ranks.conns, Run(ranks.new_cell("dist.barrier()"), "dist.barrier()"))
    pending = set(ranks.conns)
    for _rank, reply in receive(ranks.conns, pending, time.monotonic() + CHECK_TIMEOUT_S):
        if not isinstance(reply, Value):
            break  # broken for sure: this rank stays pending
    if pending:
        ranks.stop()
        return (
            f"{what}, but the process group is no longer usable (a barrier did not complete within "
            f"{CHECK_TIMEOUT_S:g}s: a collective was cut short on some rank). The ranks were stopped: "
            f"{RESTART_HINT}"
        )
    return f"{what}; the ranks are still running, with their state, and the process group is usable."


def peer_failed(ranks: LiveRanks, pending: set[int], replies: dict[int, Reply]) -> RankError:
    """Some ranks raised while the rest still run the cell: where they wait, then interrupt them."""
    failed = {r: reply for r, reply in replies.items() if isinstance(reply, Error)}
    waiting = sorted(pending)
    why = "blocked inside a collective that the failed rank never joined"
    lines, _ = _waiting_then_interrupted(
        ranks, waiting, "was still in the cell, waiting", f"Rank(s) {_listed(waiting)}", why
    )
    return RankError(
        "\n".join([failure_text(failed), *lines]), errors={r: e.traceback for r, e in failed.items()}
    )


def hung(ranks: LiveRanks, stuck: list[int], finished: list[int], timeout: float) -> LaunchTimeout:
    """Ranks silent in the cell for `timeout`: show where each waits, then interrupt them, or stop all."""
    lines = [
        f"the cell hung: rank(s) {_listed(stuck)} printed nothing for {timeout:g}s and did not finish the cell.",
        f"ranks that finished the cell: {_listed(finished) or 'none'}",
    ]
    why = "they are blocked inside a collective"
    more, stacks = _waiting_then_interrupted(ranks, stuck, "is waiting", "The stuck ranks", why, RESTART_HINT)
    return LaunchTimeout(
        "\n".join(lines + more), silent_ranks=stuck, run_dir=str(ranks.config.out_dir), stacks=stacks
    )


def _waiting_then_interrupted(
    ranks: LiveRanks, waiting: list[int], waits: str, who: str, why: str, hint: str = ""
) -> tuple[list[str], dict[int, str]]:
    """Where each of `waiting` waits, then the outcome of interrupting them: usable ranks, or all stopped."""
    stacks = read_stacks(ranks, waiting)
    lines = []
    for rank in waiting:
        lines += ["", f"rank {rank} {waits} here (most recent call first):", stacks.get(rank, "  (no stack)")]
    if interrupt(ranks, set(waiting), {}):
        lines += ["", check_group(ranks, f"{who} were interrupted")]
    else:
        ranks.stop()
        lines += [
            "",
            f"{who} did not answer an interrupt within {INTERRUPT_WAIT_S:g}s ({why}), so every rank was "
            f"stopped. {hint}".rstrip(),
        ]
    return lines, stacks


def died(ranks: LiveRanks, rank: int | None, exitcode: int | None = None) -> LaunchError:
    """A rank is gone: say who left, with which code, and what this cell wrote; stop the rest."""
    # `exitcode` is known when the cell called os._exit. torchrun reports a rank that failed, never one
    # that exited 0: a rank gone while torchrun runs on and says nothing left with code 0
    if exitcode is None:
        exitcode = _silent_exit(ranks, rank)
    ranks.follow(final=True)
    returncode = ranks.agent_exit_code()
    error: LaunchError
    if exitcode is None and returncode not in (None, 0):
        error = ranks.follower.failure(returncode, stderr_since=ranks.stderr_at)
    else:
        why = "the rank's connection closed without a report from torchrun"
        if exitcode is not None:
            why = f"exited with code {exitcode} during the cell"
        said = "" if rank is None else rank_stderr(ranks.follower.tail, rank, ranks.stderr_at.get(rank, 0))
        error = WorkerFailed(
            -1 if rank is None else rank,
            -1 if exitcode is None else exitcode,
            why,
            "",
            run_dir=str(ranks.config.out_dir),
            stderr_tail=stderr_tail(said),
        )
    ranks.stop()
    message = str(error)
    if exitcode is not None:  # not a failure of its own making, maybe: it left, the others could not go on
        message = message.replace(f"rank {rank} failed: exited", f"rank {rank} exited", 1)
    error.args = (f"{message}\n\nThe other ranks were stopped: {RESTART_HINT}",)
    return error


def _silent_exit(ranks: LiveRanks, rank: int | None) -> int | None:
    """0 if `rank`'s process is gone while torchrun runs on without a report; else None."""
    pid = ranks.pids.get(rank) if rank is not None else None
    deadline = time.monotonic() + ranks.config.grace_s + 10
    gone_since: float | None = None
    while ranks.agent_exit_code() is None and time.monotonic() < deadline:
        if pid is not None and not psutil.pid_exists(pid):  # torchrun reaps an exited rank within 0.1 s
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > EXIT_REPORT_WAIT_S:
                return 0
        time.sleep(0.02)
    return None


def read_stacks(ranks: LiveRanks, which: list[int]) -> dict[int, str]:
    """Each rank's current Python stack (most recent call first), with the cells' lines."""
    pids = {r: ranks.pids[r] for r in which if r in ranks.pids}
    dumps = stack_dumps.ask_dumps(pids, ranks.config.log_dir)
    return {rank: format_stack(stack_dumps.main_thread(dump), ranks.sources) for rank, dump in dumps.items()}


def format_stack(dump: str, sources: Mapping[int, str]) -> str:
    """A faulthandler dump, down to the innermost cell frame, each cell frame followed by its line."""
    frames = list(stack_dumps.FRAME.finditer(dump))
    cell_frames = [i for i, m in enumerate(frames) if m["file"].startswith("<cell ")]
    if cell_frames:
        frames = frames[: cell_frames[-1] + 1]  # drop the server's own frames below the cell
    out = []
    for m in frames:
        out.append(f'  File "{m["file"]}", line {m["line"]} in {m["func"]}')
        cell = re.fullmatch(r"<cell (\d+)>", m["file"])
        source = sources.get(int(cell[1]), "").splitlines() if cell else []
        if 0 < int(m["line"]) <= len(source):
            out.append(f"    {source[int(m['line']) - 1].strip()}")
    return "\n".join(out)


# start_ranks takes the launcher's options marked `live` (see launcher/options.py); these four stay
# positional as they always were, and the ranks wait longer to start than one script does
@with_options(
    LIVE_OPTIONS,
    positional=("nproc", "backend", "timeout", "env"),
    defaults={"startup_timeout": STARTUP_TIMEOUT_S},
)
def start_ranks(*args: Any, **options: Any) -> LiveRanks:
    """Start `nproc` DDP ranks under torchrun that stay up between cells.

    Returns once every rank has run ``init_process_group`` (nccl with one GPU per rank where GPUs
    exist, gloo on the CPU, as `launch` chooses). Each rank's namespace starts with ``torch``,
    ``dist``, ``nn``, ``rank``, ``local_rank``, ``world_size`` and ``device``. `timeout` is the
    default of each `run`: a cell whose ranks print nothing for that long counts as hung;
    `startup_timeout` (a number here, not None) is for every rank to import torch and join the
    group; the logs go to `run_dir`, by default ``runs/<time>-ranks-<id>``.

    Options (each as `launch` takes it):
        {options}
    """
    bound = inspect.signature(start_ranks).bind(*args, **options)  # TypeError for an unknown keyword
    bound.apply_defaults()
    given = dict(bound.arguments)
    timeout = check_seconds("timeout", given.pop("timeout"), allow_none=True)
    startup_timeout = check_seconds("startup_timeout", given.pop("startup_timeout"), allow_none=False)
    if given["run_dir"] is None:
        given["run_dir"] = default_run_dir("ranks")
    # the run's own timeout stays off: a rank that waits for its next cell is not hung
    config = make_config(RANK_SERVER, (), **given, timeout=None, max_restarts=0, grace_s=3.0, progress="off")
    return LiveRanks(config, timeout=timeout, startup_timeout=startup_timeout)
