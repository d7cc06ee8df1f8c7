"""The messages between the notebook kernel and a live rank, pickled over an authenticated Unix socket.
Kernel to rank: a `Run` per request, None to exit; rank to kernel: ``(rank, pid)`` once, then a `Reply`
per `Run`. The standard library only: both sides load it."""

from __future__ import annotations

from dataclasses import dataclass

ADDRESS_ENV = "DDP_RANKS_ADDRESS"  # the kernel's Unix socket
AUTHKEY_ENV = "DDP_RANKS_AUTHKEY"  # a random key per start, hex; the rank removes it from its environment


@dataclass(frozen=True)
class Run:
    """Bind the pickled dict `values` (if any), run `code`; reply with its last expression's value."""

    cell_id: int
    code: str
    values: bytes | None = None


@dataclass(frozen=True)
class Value:
    """The value pickled (None where it cannot be), and its repr on the rank."""

    cell_id: int
    data: bytes | None
    text: str


@dataclass(frozen=True)
class Error:
    """The cell raised: ``"Type: message"``, and the traceback from the cell's frames on."""

    cell_id: int
    error: str
    traceback: str


@dataclass(frozen=True)
class Interrupted:
    """A SIGINT ended the cell on the rank; the rank keeps its namespace."""

    cell_id: int


@dataclass(frozen=True)
class Exited:
    """The cell called ``os._exit(code)``: sent just before the rank's process ends."""

    cell_id: int
    code: int


Reply = Value | Error | Interrupted | Exited
