"""The notebook's end of pdb on a live rank: each prompt a rank sends is answered here.

A rank that stops in pdb (`breakpoint()`, ``pdb.set_trace()``, ``dist.breakpoint``, ``%%ranks --debug N``,
``%ranks debug N``) sends what pdb printed and its prompt (`protocol.Prompt`). The `Console` shows the text,
then answers with the next scripted command, if any are left, or with what the learner types in
Jupyter's input box (the kernel's ``input``). A kernel that cannot ask (papermill) gets ``q``, and the
cell says how to script the commands instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ddp_helpers.errors import RankError
from ddp_helpers.rank.live_protocol import Prompt

QUIT_COMMANDS = ("q", "quit", "exit")
WHERE_COMMAND = "ranks where"  # typed at a pdb prompt: every rank's stack, then the same prompt again
NO_INPUT = (
    "rank {rank} stopped in pdb, but this kernel cannot ask for input ({why}), so the debugger quit. "
    "Give the commands with the cell instead: %%ranks --debug {rank} --pdb-commands 'p x;; c' "
    "(pdb's own separator, ;;), or ranks.run(code, debug={rank}, pdb_commands=['p x', 'c'])."
)


class DebuggerQuit(RankError):
    """pdb on a live rank was quit (``q``, or a kernel that cannot answer): the cell stopped there."""


def split_commands(text: str | None) -> list[str]:
    """``"p x;; c"`` as pdb's commands, ``["p x", "c"]`` (pdb's own separator is ``;;``)."""
    return [part.strip() for part in (text or "").split(";;") if part.strip()]


def kernel_input(prompt: str) -> str:
    """The kernel's ``input``: Jupyter's input box in a notebook (looked up at call time)."""
    return input(prompt)


class Console:
    """Answers pdb's prompts from the ranks: scripted commands first, then the learner."""

    def __init__(
        self,
        commands: Iterable[str] = (),
        read: Callable[[str], str] = kernel_input,
        where: Callable[[], str] | None = None,
    ) -> None:
        self.commands = list(commands)
        self.read = read
        self.where = where
        self.quit_rank: int | None = None  # the rank whose pdb was quit, if one was
        self.no_input: str | None = None  # why the kernel could not ask, if it could not
        self.prompts = 0

    def answer(self, rank: int, prompt: Prompt) -> str:
        """Show what pdb printed on `rank`, and return the command for its prompt."""
        self.prompts += 1
        if prompt.text:
            print(prompt.text, end="" if prompt.text.endswith("\n") else "\n", flush=True)
        line = self._next(prompt.prompt)
        while line.strip() == WHERE_COMMAND and self.where is not None:
            print(self.where(), flush=True)
            line = self._next(prompt.prompt)
        if line.strip() in QUIT_COMMANDS:
            self.quit_rank = rank
        return line  # an empty line (Enter) repeats pdb's last command, as in a terminal

    def _next(self, prompt: str) -> str:
        if self.commands:
            line = self.commands.pop(0)
            print(f"{prompt}{line}", flush=True)  # a scripted answer is shown as if typed
            return line
        try:
            return self.read(prompt)
        except Exception as error:  # noqa: BLE001 - StdinNotImplementedError (papermill), EOFError, ...
            # whatever it is, pdb must not be left waiting: it quits, and the cell says why
            self.no_input = NO_INPUT.format(rank="{rank}", why=_why(error))
            return "q"

    def quit_message(self, rank: int) -> str:
        if self.no_input is not None:
            return self.no_input.format(rank=rank)
        return f"you quit the debugger on rank {rank} (q): the cell stopped there"


def _why(error: Exception) -> str:
    if type(error).__name__ == "StdinNotImplementedError":
        return "papermill and other headless runs have no input box"
    if isinstance(error, EOFError):
        return "end of input"
    return f"{type(error).__name__}: {error}"
