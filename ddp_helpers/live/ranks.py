"""Live ranks: DDP processes that stay up between notebook cells.

    ranks = start_ranks(nproc=2)                 # torchrun + init_process_group, once
    ranks.run("x = torch.ones(1) * (rank + 1)\\ndist.all_reduce(x)\\nx.item()")
    ranks.gather("x")                            # [tensor([3.]), tensor([3.])]
    ranks.shutdown()

Built from the launcher's parts: the ranks run under torchrun in a session of their own, their output
goes to torchrun's per-rank log files, which are echoed as ``[rank N]`` lines, and failures are
diagnosed as `launch` diagnoses them. Each rank runs `ddp_helpers.live.server`, which takes code over
an authenticated Unix socket. The ranks exit by themselves when that socket closes, so a killed
kernel leaves nothing behind.
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path
from typing import Any

import psutil

from ..errors import (
    InvalidLaunchArguments,
    LaunchError,
    LaunchInterrupted,
    LaunchTimeout,
    RankError,
    ValueNotReturned,
    WorkerFailed,
)
from ..launcher.cell_output import shown_text
from ..launcher.checks import check_seconds
from ..launcher.config import LaunchConfig, default_run_dir, make_config
from ..launcher.diagnosis import STDERR_TAIL_LINES
from ..launcher.options import LIVE_OPTIONS, bind_options, with_options
from ..launcher.process_tree import ProcessTree
from ..launcher.runner import _Run, _start
from . import protocol

POLL_S = 0.02
MAX_VALUE_CHARS = 10_000  # a cell's value shown in the notebook: list(range(10**6)) would be 6.9 MB
RANK_SERVER = Path(__file__).with_name("server.py")  # what torchrun runs on each rank
STARTUP_TIMEOUT_S = 180.0  # importing torch and the rendezvous, on a loaded 2-core machine
INTERRUPT_WAIT_S = 5.0  # how long an interrupted rank gets to come back before the ranks are stopped
CHECK_TIMEOUT_S = 10.0  # the barrier that tells whether an interrupt left the process group usable
STACK_WAIT_S = 1.0
EXIT_REPORT_WAIT_S = 1.0  # torchrun polls its workers every 0.1 s: a failure is reported well within this


class _Shown:
    """A value that could not travel to the kernel: shown by the repr the rank sent."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class RankResults(dict):
    """The value of a cell's last expression on each rank that ran it: ``{rank: value}``.

    None where the cell ended in a statement. Values that cannot be unpickled in the kernel (an
    object of a class defined in a cell) are shown by their repr on the rank.
    """

    wall_s: float = 0.0

    def __repr__(self) -> str:
        return "\n".join(f"[rank {rank}] {shown_value(value)}" for rank, value in sorted(self.items()))


def shown_value(value: Any) -> str:
    """A cell's value as the cell shows it: its repr, cut where it would flood the notebook."""
    return shown_text(repr(value), MAX_VALUE_CHARS, "the value itself is whole: ranks.gather(name) brings it")


@dataclass
class _Rank:
    rank: int
    pid: int
    conn: Connection


def _decode(data: bytes | None, text: str) -> Any:
    if data is None:
        return _Shown(text)
    try:
        return pickle.loads(data)
    except Exception:  # e.g. a class that exists only on the rank
        return _Shown(text)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


class LiveRanks:
    """DDP ranks that keep running between cells. Make them with `start_ranks`."""

    def __init__(self, config: LaunchConfig, timeout: float | None, startup_timeout: float) -> None:
        self._config = config
        self.timeout = timeout
        self._startup_timeout = startup_timeout
        self._base_run_dir = config.run_dir
        self._starts = 0
        self._cells: dict[int, str] = {}  # cell id -> code, to show a stuck rank's line
        self._next_id = 0
        self._ranks: dict[int, _Rank] = {}
        self._stderr_at: dict[int, int] = {}  # each rank's stderr.log size when the current cell began
        self._last_cell = 0  # the id of the last request sent
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = True
        self._start()
        atexit.register(_shutdown_quietly, weakref.ref(self))

    # ------------------------------------------------------------------ start and stop
    @property
    def world_size(self) -> int:
        return self._config.nproc

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def run_dir(self) -> Path:
        """Where this start's logs are (``logs/``), with the per-rank stack dumps (``stacks/``)."""
        return self._config.run_dir

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc is not None and self._proc.poll() is None

    def _start(self) -> None:
        if self._starts:
            self._config.run_dir = self._base_run_dir / f"restart-{self._starts}"
        self._starts += 1
        config = self._config
        self._socket_dir = Path(tempfile.mkdtemp(prefix="ddp-ranks-"))  # 0700: only this user
        address = str(self._socket_dir / "control.sock")
        authkey = secrets.token_bytes(32)
        stacks = config.run_dir / "stacks"
        stacks.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
        config.env.update(
            {
                protocol.ADDRESS_ENV: address,
                protocol.AUTHKEY_ENV: authkey.hex(),
                protocol.STACKS_ENV: str(stacks),
            }
        )
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(config.nproc)
        self._run = _Run(config, "off")
        # live ranks have no result.logs: the held-back note names the files
        self._run.echo.kept_in = (
            f"each rank's stdout.log and stderr.log under {config.log_dir}/*/attempt_0/<rank>/"
        )
        self._proc = _start(config)  # in a session of its own: never signalled by the kernel's own Ctrl-C
        config.env.pop(protocol.AUTHKEY_ENV)  # the key lives in the ranks' environment only
        self._tree = ProcessTree(self._proc.pid)
        self._closed = False
        try:
            self._accept(listener, authkey)
        except BaseException:
            self._stop()
            raise
        finally:
            listener.close()

    def _accept(self, listener: socket.socket, authkey: bytes) -> None:
        """Wait until every rank has joined the process group and connected back."""
        deadline = time.monotonic() + self._startup_timeout
        ranks: dict[int, _Rank] = {}
        try:
            while len(ranks) < self._config.nproc:
                self._follow()
                if self._proc.poll() is not None:
                    raise self._run.failure(self._proc.returncode)
                if time.monotonic() > deadline:
                    raise LaunchTimeout(
                        f"the ranks did not start within {self._startup_timeout:g}s: "
                        f"{len(ranks)} of {self._config.nproc} connected. Logs: {self._config.log_dir}",
                        silent_ranks=sorted(set(range(self._config.nproc)) - set(ranks)),
                        run_dir=str(self._config.run_dir),
                    )
                readable, _, _ = select.select([listener], [], [], 0.1)
                if not readable:
                    continue
                sock, _ = listener.accept()
                conn = Connection(sock.detach())
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                _, rank, _local, pid, _backend, _device = conn.recv()
                ranks[rank] = _Rank(rank, pid, conn)
        except KeyboardInterrupt:
            raise LaunchInterrupted(
                "interrupted while the ranks started; every process was stopped"
            ) from None
        self._ranks = dict(sorted(ranks.items()))
        self._follow(final=True)

    def _follow(self, final: bool = False) -> None:
        self._run.poll_files(final=final)

    def _stop(self) -> None:
        """Stop every process of the ranks (SIGTERM, then SIGKILL) and close the channel."""
        for r in self._ranks.values():
            try:
                r.conn.close()
            except OSError:
                pass
        self._ranks = {}
        if self._proc is not None:
            self._tree.terminate(self._config.grace_s)
            try:
                self._proc.wait(timeout=self._config.grace_s + 5)
            except subprocess.TimeoutExpired:
                pass
            if self._proc.stdout:
                self._proc.stdout.close()
            lifeline = getattr(self._proc, "lifeline", None)  # the agent's: see launch._start
            if lifeline is not None:
                lifeline.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._closed = True

    def shutdown(self) -> None:
        """Ask every rank to exit, then make sure that every process is gone."""
        if self._closed:
            return
        for r in self._ranks.values():
            try:
                r.conn.send(("shutdown", 0))
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=self._config.grace_s + 5)
            except subprocess.TimeoutExpired:
                pass
            self._follow(final=True)
        self._stop()

    def restart(self) -> LiveRanks:
        """Stop the ranks, whatever their state, and start fresh ones (new namespaces, new group)."""
        self._stop()
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
        self, code: str, ranks: Iterable[int] | int | None = None, timeout: float | None = ...
    ) -> RankResults:
        """Run `code` on `ranks` (default: every rank) and wait until each has finished it.

        Each rank's output streams in as ``[rank N]`` lines. Returns each rank's value of the last
        expression. Raises `RankError` if the code raised on any rank (the ranks keep running),
        `LaunchTimeout` if a rank still in the cell printed nothing for `timeout` seconds,
        `WorkerFailed` if a rank died, and `LaunchInterrupted` on a kernel interrupt.
        """
        if not isinstance(code, str):
            raise InvalidLaunchArguments(f"code must be a string, got {type(code).__name__}")
        check_syntax(code)  # a syntax error is reported here, before anything is sent
        targets = self._targets(ranks)
        cell_id = self._new_id(code)
        started = time.monotonic()
        replies = self._request(("run", cell_id, code), targets, self._timeout(timeout))
        failed = {r: reply for r, reply in replies.items() if reply[0] == "error"}
        if failed:
            first = min(failed)
            message = f"rank {first} failed: {failed[first][2]}\n\n{failed[first][3]}"
            others = [r for r in sorted(failed) if r != first]
            if others:
                message += "\n\nalso failed on rank(s) " + ", ".join(
                    f"{r} ({failed[r][2].splitlines()[0]})" for r in others
                )
            message += "\n\nThe ranks are still running, with their state."
            raise RankError(message, errors={r: reply[3] for r, reply in failed.items()})
        results = RankResults({r: _decode(reply[2], reply[3]) for r, reply in replies.items()})
        results.wall_s = time.monotonic() - started
        return results

    def gather(self, name: str, ranks: Iterable[int] | int | None = None) -> list[Any]:
        """The value bound to `name` on each rank, in rank order (tensors moved to the CPU).

        Raises `NameError` where `name` is unbound, and `ValueNotReturned` (sorted ranks, each
        value's repr) where a value cannot travel: it does not pickle, or its class was defined in a cell.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidLaunchArguments(f"gather takes a variable name, got {name!r}")
        targets = self._targets(ranks)
        replies = self._request(("gather", self._new_id(""), name), targets, self._timeout(...))
        missing = sorted(r for r, reply in replies.items() if reply[0] == "error")
        if missing:
            raise NameError(f"{replies[missing[0]][2]} on rank(s) {', '.join(map(str, missing))}")
        values, reprs, reasons = [], {}, {}
        for rank in targets:
            _, _, data, text = replies[rank]
            try:
                if data is None:
                    raise pickle.PicklingError("it cannot be pickled on the rank")
                values.append(pickle.loads(data))
            except Exception as error:  # noqa: BLE001 - any unpickling failure means the same thing here
                reprs[rank], reasons[rank] = text, _why_not_returned(error)
        if reprs:
            first = min(reprs)
            shown = "\n".join(f"[rank {r}] {reprs[r][:200]}" for r in sorted(reprs))
            raise ValueNotReturned(
                f"{name} cannot be brought back from rank(s) {', '.join(map(str, sorted(reprs)))}: "
                f"{reasons[first]}. Its repr there (what a cell ending in {name} shows):\n{shown}\n"
                f"Gather something that pickles instead: numbers, tensors, or lists and dicts of them.",
                reprs=reprs,
            )
        return values

    def push(self, **values: Any) -> None:
        """Bind each keyword to the same value on every rank, e.g. ``ranks.push(lr=0.1)``."""
        if not values:
            raise InvalidLaunchArguments("push takes keyword arguments, e.g. ranks.push(lr=0.1)")
        try:
            data = pickle.dumps(values)
        except Exception as error:
            raise InvalidLaunchArguments(f"push: the values cannot be pickled: {error}") from None
        self._request(("push", self._new_id(""), data), list(self._ranks), self._timeout(...))

    # ------------------------------------------------------------------ internals
    def _timeout(self, timeout: Any) -> float | None:
        return _check_timeout(self.timeout if timeout is ... else timeout)

    def _new_id(self, code: str) -> int:
        self._next_id += 1
        self._cells[self._next_id] = code
        return self._next_id

    def _targets(self, ranks: Iterable[int] | int | None) -> list[int]:
        if self._closed or not self._ranks:
            raise InvalidLaunchArguments(
                "the ranks are not running (shut down, or stopped after a failure): "
                "ranks.restart() or start_ranks() starts new ones"
            )
        if ranks is None:
            return list(self._ranks)
        chosen = [ranks] if isinstance(ranks, int) else list(ranks)
        bad = [r for r in chosen if isinstance(r, bool) or not isinstance(r, int) or r not in self._ranks]
        if bad or not chosen:
            raise InvalidLaunchArguments(
                f"ranks must be among 0..{self.world_size - 1} (world size {self.world_size}), got {ranks!r}"
            )
        return sorted(set(chosen))

    def _request(self, message: tuple, targets: list[int], timeout: float | None) -> dict[int, tuple]:
        # Lines printed since the last cell ended (a thread of an earlier cell) are not this cell's:
        # they are shown first, labelled with the cell they came after.
        self._run.label_note = f" (after cell {self._last_cell})" if self._last_cell else ""
        try:
            self._follow(final=True)
        finally:
            self._run.label_note = ""
        self._run.echo.close()
        self._run.echo.new_cell()
        self._last_cell = message[1]
        self._stderr_at = self._stderr_sizes()  # a death is explained by what *this* cell wrote
        for rank in targets:
            self._ranks[rank].conn.send(message)
        pending = set(targets)
        replies: dict[int, tuple] = {}
        started = time.monotonic()
        try:
            self._wait(pending, replies, started, timeout, message[1])
        except KeyboardInterrupt:
            raise self._interrupted(pending, replies) from None
        self._follow(final=True)  # every line the cell printed is on disk by now: show the rest
        self._run.echo.close()  # and what was held back, with its count: this cell's output ends here
        return replies

    def _wait(
        self, pending: set[int], replies: dict, started: float, timeout: float | None, cell_id: int
    ) -> None:
        by_conn = {self._ranks[r].conn: r for r in pending}
        while pending:
            for conn in wait([self._ranks[r].conn for r in pending], timeout=POLL_S):
                rank = by_conn[conn]
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    raise self._died(rank) from None
                if replies[rank][0] == "exited":  # the cell called os._exit(code)
                    raise self._died(rank, exitcode=replies[rank][2])
                pending.discard(rank)
            self._follow()
            if self._proc.poll() is not None:
                raise self._died(None)
            if timeout is not None and pending:
                now = time.monotonic()
                stuck = [r for r in sorted(pending) if now - self._last_heard(r, started) > timeout]
                if stuck:
                    raise self._hung(stuck, sorted(set(replies)), timeout, cell_id)

    def _stderr_sizes(self) -> dict[int, int]:
        sizes = {}
        for rank in self._ranks:
            path = self._run.tail.rank_file(rank, "stderr.log")
            try:
                sizes[rank] = path.stat().st_size if path is not None else 0
            except OSError:
                sizes[rank] = 0
        return sizes

    def _last_heard(self, rank: int, since: float) -> float:
        state = self._run.ranks.get(rank)
        heard = state.last_heard if state is not None and state.last_heard is not None else since
        return max(heard, since)

    def _died(self, rank: int | None, exitcode: int | None = None) -> LaunchError:
        """A rank is gone: say who left, with which code, and what this cell wrote; stop the rest.

        `exitcode` is known when the cell called ``os._exit`` (the rank said so). Otherwise torchrun
        reports a rank that failed, but not one that exited with code 0: when the rank's process is
        gone and torchrun, still running, has reported nothing, that silence means code 0.
        """
        pid = self._ranks[rank].pid if rank is not None and rank in self._ranks else None
        deadline = time.monotonic() + self._config.grace_s + 10
        gone_since: float | None = None
        while exitcode is None and self._proc.poll() is None and time.monotonic() < deadline:
            if pid is not None and not _running(pid):
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > EXIT_REPORT_WAIT_S:
                    exitcode = 0
            time.sleep(POLL_S)
        self._follow(final=True)
        returncode = self._proc.poll()
        error: LaunchError
        if exitcode is None and returncode not in (None, 0):
            error = self._run.failure(returncode, stderr_since=self._stderr_at)
        else:
            said = self._cell_stderr(rank)
            error = WorkerFailed(
                rank if rank is not None else -1,
                exitcode if exitcode is not None else -1,
                f"exited with code {exitcode} during the cell"
                if exitcode is not None
                else "the rank's connection closed without a report from torchrun",
                "",
                run_dir=str(self._config.run_dir),
                stderr_tail="\n".join(said),
            )
        self._stop()
        message = str(error)
        if (
            exitcode is not None
        ):  # not a failure of its own making, maybe: it left, and the others could not go on
            message = message.replace(f"rank {rank} failed: exited", f"rank {rank} exited", 1)
        message += "\n\nThe other ranks were stopped: ranks.restart() starts afresh."
        error.args = (message,)
        return error

    def _cell_stderr(self, rank: int | None) -> list[str]:
        """The last lines `rank` wrote to stderr during this cell (never an earlier cell's)."""
        path = self._run.tail.rank_file(rank, "stderr.log") if rank is not None else None
        if path is None:
            return []
        with open(path, "rb") as fh:
            fh.seek(self._stderr_at.get(rank, 0))
            lines = fh.read().decode(errors="replace").splitlines()
        return [line for line in lines if line.strip()][-STDERR_TAIL_LINES:]

    def _interrupted(self, pending: set[int], replies: dict[int, tuple]) -> LaunchInterrupted:
        """Ctrl-C in the kernel: interrupt the ranks still in the cell, keep them if the group survived."""
        came_back = self._interrupt(pending, replies)
        if not came_back:
            self._stop()
            return LaunchInterrupted(
                f"interrupted: rank(s) {', '.join(map(str, sorted(pending)))} did not return from the cell within "
                f"{INTERRUPT_WAIT_S:g}s (a rank blocked inside a collective cannot be interrupted), so every "
                "rank was stopped. ranks.restart() starts afresh."
            )
        return LaunchInterrupted(self._check_group("interrupted: every rank stopped the cell"))

    def _signal(self, ranks: Iterable[int], sig: int) -> None:
        """Signal the rank processes themselves: never torchrun's agent, which would stop the job."""
        for rank in ranks:
            try:
                os.kill(self._ranks[rank].pid, sig)
            except ProcessLookupError:
                pass

    def _interrupt(self, pending: set[int], replies: dict[int, tuple]) -> bool:
        """SIGINT the ranks in `pending`; True if each came back within INTERRUPT_WAIT_S."""
        self._signal(pending, signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while pending and time.monotonic() < deadline:
            for conn in wait([self._ranks[r].conn for r in pending], timeout=POLL_S):
                rank = next(r for r in pending if self._ranks[r].conn is conn)
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    return False
                pending.discard(rank)
            self._follow()
        self._follow(final=True)
        return not pending

    def _check_group(self, what: str) -> str:
        """A barrier with a deadline: after an interrupt, is the process group still usable?"""
        cell_id = self._new_id("")
        for r in self._ranks.values():
            r.conn.send(("check", cell_id))
        pending = set(self._ranks)
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for conn in wait([self._ranks[r].conn for r in pending], timeout=POLL_S):
                rank = next(r for r in pending if self._ranks[r].conn is conn)
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    reply = ("error",)
                if reply[0] == "ok":
                    pending.discard(rank)
                else:
                    deadline = 0  # broken for sure
        if pending:
            self._stop()
            return (
                f"{what}, but the process group is no longer usable (a barrier did not complete within "
                f"{CHECK_TIMEOUT_S:g}s: a collective was cut short on some rank). The ranks were stopped: "
                "ranks.restart() starts afresh."
            )
        return f"{what}; the ranks are still running, with their state, and the process group is usable."

    def _hung(self, stuck: list[int], finished: list[int], timeout: float, cell_id: int) -> LaunchTimeout:
        stacks = self._stacks(stuck)
        lines = [
            f"the cell hung: rank(s) {', '.join(map(str, stuck))} printed nothing for {timeout:g}s "
            f"and did not finish the cell.",
            f"ranks that finished the cell: {', '.join(map(str, finished)) or 'none'}",
        ]
        for rank in stuck:
            lines += [
                "",
                f"rank {rank} is waiting here (most recent call first):",
                stacks.get(rank, "  (no stack)"),
            ]
        pending = set(stuck)
        came_back = self._interrupt(pending, {})
        if came_back:
            lines += ["", self._check_group("The stuck ranks were interrupted")]
        else:
            self._stop()
            lines += [
                "",
                f"The stuck ranks did not answer an interrupt within {INTERRUPT_WAIT_S:g}s (they are blocked "
                "inside a collective), so every rank was stopped. ranks.restart() starts afresh.",
            ]
        return LaunchTimeout("\n".join(lines), silent_ranks=stuck, run_dir=str(self._config.run_dir))

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """Each rank's current Python stack, from faulthandler on SIGUSR1, trimmed to the cell's frames."""
        files = {r: self._config.run_dir / "stacks" / f"rank{r}.txt" for r in ranks}
        offsets = {r: files[r].stat().st_size if files[r].exists() else 0 for r in ranks}
        self._signal(ranks, protocol.STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not all(
            files[r].exists() and files[r].stat().st_size > offsets[r] for r in ranks
        ):
            time.sleep(0.05)
        time.sleep(0.1)  # let the dump finish
        stacks = {}
        for rank in ranks:
            try:
                with open(files[rank]) as fh:
                    fh.seek(offsets[rank])
                    stacks[rank] = self._format_stack(fh.read())
            except FileNotFoundError:
                continue
        return stacks

    def _format_stack(self, dump: str) -> str:
        frames = [m for m in _FRAME.finditer(dump)]
        cell_frames = [i for i, m in enumerate(frames) if m["file"].startswith("<cell ")]
        if cell_frames:
            frames = frames[: cell_frames[-1] + 1]  # drop the server's own frames below the cell
        out = []
        for m in frames:
            out.append(f'  File "{m["file"]}", line {m["line"]} in {m["func"]}')
            cell = re.fullmatch(r"<cell (\d+)>", m["file"])
            if cell:
                source = self._cells.get(int(cell[1]), "").splitlines()
                number = int(m["line"])
                if 0 < number <= len(source):
                    out.append(f"    {source[number - 1].strip()}")
        return "\n".join(out)


def check_syntax(code: str) -> None:
    """Raise the cell's SyntaxError, with its source line (the compiler leaves it out for ``return``, ``await``)."""
    try:
        compile(code, "<cell>", "exec")
    except SyntaxError as error:
        lines = code.splitlines()
        if not error.text and error.lineno and 0 < error.lineno <= len(lines):
            error.text = lines[error.lineno - 1] + "\n"
            error.offset = error.offset or 1
        raise error.with_traceback(None) from None


def _why_not_returned(error: Exception) -> str:
    if isinstance(error, pickle.PicklingError) and str(error) == "it cannot be pickled on the rank":
        return str(error)
    if isinstance(error, AttributeError | ModuleNotFoundError | ImportError):
        # pickle stores a class by name: one defined in a cell exists only on the ranks
        return f"its class is not importable in the kernel ({error}): a class defined in a cell exists only on the ranks"
    return f"it cannot be unpickled in the kernel ({type(error).__name__}: {error})"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _check_timeout(timeout: Any) -> float | None:
    return check_seconds("timeout", timeout, allow_none=True)


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
def start_ranks(*args: Any, **options: Any) -> LiveRanks:
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
