"""One start of the live ranks (what `LiveRanks` holds between two restarts): torchrun with
`rank/live_server.py` on each rank, a connection to each, their logs echoed as ``[rank N]`` lines, and
`receive`, the one loop that reads the ranks' replies. `CellLog` outlives the starts."""

from __future__ import annotations

import os
import secrets
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path

from ddp_helpers.errors import LaunchInterrupted, LaunchTimeout
from ddp_helpers.kernel.launcher.config import LaunchConfig
from ddp_helpers.kernel.launcher.diagnosis import STDERR_TAIL_LINES
from ddp_helpers.kernel.launcher.process_tree import ProcessTree
from ddp_helpers.kernel.launcher.processes import RunProcess, exit_code, start_run, stop_run, wait_for_exit
from ddp_helpers.kernel.launcher.run_follower import RunFollower
from ddp_helpers.rank import live_protocol as protocol
from ddp_helpers.rank.live_protocol import Hello, Reply, Request, Shutdown
from ddp_helpers.run_contract import STDERR_LOG

POLL_S = 0.02
RANK_SERVER = (
    Path(__file__).resolve().parents[2] / "rank" / "live_server.py"
)  # what torchrun runs on each rank


@dataclass
class CellLog:
    """Every request's id and code, for the life of a `LiveRanks` (ids go on across restarts)."""

    sources: dict[int, str] = field(default_factory=dict)
    last_id: int = 0  # the id given last
    last_sent: int = 0  # the id of the last request sent

    def new(self, code: str) -> int:
        self.last_id += 1
        self.sources[self.last_id] = code
        return self.last_id


@dataclass
class RankLink:
    """The kernel's end of one rank: its process and its connection."""

    rank: int
    pid: int
    conn: Connection


def receive(
    conns: Mapping[int, Connection],
    pending: set[int],
    deadline: float | None = None,
    between: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Reply | None]]:
    """Each reply from the ranks in `pending` as it arrives, ``(rank, reply)``; reply None: the connection closed."""
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


class Session:
    """The ranks of one start: started on construction, every process gone after `stop`."""

    def __init__(self, config: LaunchConfig, startup_timeout: float) -> None:
        self.config = config
        self.links: dict[int, RankLink] = {}
        self.stderr_at: dict[int, int] = {}  # each rank's stderr.log size when the current cell began
        self.proc: RunProcess | None = None
        self.closed = False
        self._socket_dir = Path(tempfile.mkdtemp(prefix="ddp-ranks-"))  # 0700: only this user
        authkey = secrets.token_bytes(32)
        listener = self._listen()
        self.run = RunFollower(config, "off")
        # live ranks have no result.logs: the held-back note names the files
        self.run.echo.kept_in = (
            f"each rank's stdout.log and stderr.log under {config.log_dir}/*/attempt_0/<rank>/"
        )
        # where the ranks connect back to, and the key: in the ranks' environment only, never in self.config
        reach_back = {protocol.ADDRESS_ENV: str(self._address), protocol.AUTHKEY_ENV: authkey.hex()}
        try:
            # in a session of its own: never signalled by the kernel's own Ctrl-C
            self.proc = start_run(config.derive(env={**config.env, **reach_back}))
            self.tree = ProcessTree(self.proc.pid)
            self._accept(listener, authkey, startup_timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            listener.close()
            # Every rank has connected (or none will): the socket's file is needed no more, and a killed
            # kernel could not remove its folder later. The connections outlive the file.
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    @property
    def alive(self) -> bool:
        return not self.closed and self.proc is not None and exit_code(self.proc) is None

    def agent_exit_code(self) -> int | None:
        """torchrun's exit code (negative: the signal that ended it), or None while it runs or before."""
        return None if self.proc is None else exit_code(self.proc)

    @property
    def _address(self) -> Path:
        return self._socket_dir / "control.sock"

    def _listen(self) -> socket.socket:
        """The socket the ranks connect back to."""
        address = str(self._address)
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(address)
        except OSError as err:  # nothing has started yet: leave nothing behind either
            listener.close()
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            size = len(os.fsencode(address))
            hint = f" (its path has {size} bytes; Linux allows 107: set TMPDIR to a shorter folder)"
            raise OSError(
                f"live ranks cannot listen at {address}: {err}{hint if size > 107 else ''}"
            ) from err
        listener.listen(self.config.local_world_size)
        return listener

    def _accept(self, listener: socket.socket, authkey: bytes, startup_timeout: float) -> None:
        """Wait until every rank has joined the process group and connected back."""
        nproc = self.config.local_world_size
        deadline = time.monotonic() + startup_timeout
        links: dict[int, RankLink] = {}
        try:
            while len(links) < nproc:
                self.follow()
                returncode = self.agent_exit_code()
                if returncode is not None:
                    raise self.run.failure(returncode)
                if time.monotonic() > deadline:
                    raise LaunchTimeout(
                        f"the ranks did not start within {startup_timeout:g}s: "
                        f"{len(links)} of {nproc} connected. Logs: {self.config.log_dir}",
                        silent_ranks=sorted(set(range(nproc)) - set(links)),
                        run_dir=str(self.config.out_dir),
                    )
                readable, _, _ = select.select([listener], [], [], 0.1)
                if readable:
                    link = _handshake(listener, authkey)
                    links[link.rank] = link
        except KeyboardInterrupt:
            raise LaunchInterrupted(
                "interrupted while the ranks started; every process was stopped"
            ) from None
        self.links = dict(sorted(links.items()))
        self.follow(final=True)

    # ------------------------------------------------------------------ talking to the ranks
    def follow(self, final: bool = False) -> None:
        """Echo what the ranks wrote to their logs since the last look (`final`: to the end of each file)."""
        self.run.poll_files(final=final)

    def send(self, ranks: Iterable[int], message: Request | Shutdown) -> None:
        for rank in ranks:
            self.links[rank].conn.send(message)

    def replies(
        self, pending: set[int], deadline: float | None = None, between: Callable[[], None] | None = None
    ) -> Iterator[tuple[int, Reply | None]]:
        """`receive` from these ranks' connections."""
        return receive({r: self.links[r].conn for r in pending}, pending, deadline, between)

    def signal(self, ranks: Iterable[int], sig: int) -> None:
        """Signal the rank processes themselves: never torchrun's agent, which would stop the job."""
        for rank in ranks:
            try:
                os.kill(self.links[rank].pid, sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ one cell's output
    def begin_cell(self, after_cell: int) -> None:
        """Close the previous cell's output and start this one's."""
        self.run.label_note = f" (after cell {after_cell})" if after_cell else ""
        try:
            self.follow(final=True)
        finally:
            self.run.label_note = ""
        self.run.echo.close()
        self.run.echo.new_cell()
        self.stderr_at = self._stderr_sizes()  # a death is explained by what *this* cell wrote

    def end_cell(self) -> None:
        self.follow(final=True)  # every line the cell printed is on disk by now: show the rest
        self.run.echo.close()  # and what was held back, with its count: this cell's output ends here

    def _stderr_sizes(self) -> dict[int, int]:
        sizes = {}
        for rank in self.links:
            path = self.run.tail.rank_file(rank, STDERR_LOG)
            try:
                sizes[rank] = path.stat().st_size if path is not None else 0
            except OSError:
                sizes[rank] = 0
        return sizes

    def cell_stderr(self, rank: int | None) -> list[str]:
        """The last lines `rank` wrote to stderr during this cell (never an earlier cell's)."""
        path = self.run.tail.rank_file(rank, STDERR_LOG) if rank is not None else None
        if rank is None or path is None:
            return []
        with open(path, "rb") as fh:
            fh.seek(self.stderr_at.get(rank, 0))
            lines = fh.read().decode(errors="replace").splitlines()
        return [line for line in lines if line.strip()][-STDERR_TAIL_LINES:]

    def last_heard(self, rank: int, since: float) -> float:
        """When `rank` last wrote anything, or `since` if it has been silent since then."""
        state = self.run.ranks.get(rank)
        heard = state.last_heard if state is not None and state.last_heard is not None else since
        return max(heard, since)

    # ------------------------------------------------------------------ the end
    def shutdown(self) -> None:
        """Ask every rank to exit, then make sure that every process is gone."""
        for link in self.links.values():
            try:
                link.conn.send(Shutdown())
            except OSError:
                pass
        if self.proc is not None:
            wait_for_exit(self.proc, self.config.grace_s + 5)
            self.follow(final=True)
        self.stop()

    def stop(self) -> None:
        """Stop every process of the ranks (the launcher's `stop_run`) and close the channel."""
        for link in self.links.values():
            try:
                link.conn.close()
            except OSError:
                pass
        self.links = {}
        if self.proc is not None:
            stop_run(self.tree, self.proc, self.config.grace_s)
        self.closed = True


def _handshake(listener: socket.socket, authkey: bytes) -> RankLink:
    """Accept one rank: both ends prove they hold the key, then the rank says who it is."""
    sock, _ = listener.accept()
    conn = Connection(sock.detach())
    deliver_challenge(conn, authkey)
    answer_challenge(conn, authkey)
    hello: Hello = conn.recv()
    return RankLink(hello.rank, hello.pid, conn)
