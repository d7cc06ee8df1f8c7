"""What the notebook kernel and a live rank agree on: where to connect, and the messages they exchange."""

from __future__ import annotations

from dataclasses import dataclass

ADDRESS_ENV = "DDP_RANKS_ADDRESS"  # the kernel's Unix socket
AUTHKEY_ENV = "DDP_RANKS_AUTHKEY"  # a random key per start, hex; the rank removes it from its environment


# ---------------------------------------------------------------- rank -> kernel, once
@dataclass(frozen=True)
class Hello:
    """A rank has joined the process group and connected back: who it is."""

    rank: int
    local_rank: int
    pid: int
    backend: str
    device: str


# ---------------------------------------------------------------- kernel -> rank: requests
@dataclass(frozen=True)
class Run:
    """Run a cell's code in the rank's namespace; reply with the value of its last expression."""

    cell_id: int
    code: str


@dataclass(frozen=True)
class Gather:
    """Reply with the value bound to `name` in the rank's namespace."""

    cell_id: int
    name: str


@dataclass(frozen=True)
class Push:
    """Bind each name of the pickled dict `values` in the rank's namespace."""

    cell_id: int
    values: bytes


@dataclass(frozen=True)
class Check:
    """After an interrupt: run a barrier, to tell whether the process group is still usable."""

    cell_id: int


@dataclass(frozen=True)
class Shutdown:
    """Leave the serve loop: the rank exits."""


Request = Run | Gather | Push | Check


# ---------------------------------------------------------------- rank -> kernel: replies
@dataclass(frozen=True)
class Value:
    """The request succeeded: the value pickled (None where it cannot be), and its repr on the rank."""

    cell_id: int
    data: bytes | None
    text: str


@dataclass(frozen=True)
class Error:
    """The request raised on the rank: ``"Type: message"``, and the traceback from the cell's frames on."""

    cell_id: int
    error: str
    traceback: str


@dataclass(frozen=True)
class Interrupted:
    """A SIGINT ended the request on the rank; the rank keeps its namespace."""

    cell_id: int


@dataclass(frozen=True)
class Exited:
    """The cell called ``os._exit(code)``: sent just before the rank's process ends."""

    cell_id: int
    code: int


Reply = Value | Error | Interrupted | Exited
