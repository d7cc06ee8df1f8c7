"""pdb on a live rank, driven as a learner drives it: a real kernel, its input requests answered.

The kernel runs ``%%ranks`` cells; a rank that stops in pdb asks through Jupyter's stdin channel
(``input_request``), which these tests answer with `jupyter_client`, as JupyterLab's input box would.
"""

from __future__ import annotations

import queue
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import torch.distributed as dist
from conftest import assert_no_processes_left
from jupyter_client.manager import start_new_kernel

from ddp_helpers.kernel.live.console import Console, split_commands
from ddp_helpers.kernel.live.ranks import may_pause
from ddp_helpers.rank import rank_debug
from ddp_helpers.rank.live_protocol import Prompt
from ddp_helpers.rank.rank_debug import process_groups, timeout_setter

pytestmark = pytest.mark.xdist_group("test_live_debug")

CELL_S = 180.0  # one cell, on a loaded 2-core machine
PROMPT = "rank 1 (Pdb) "
ALL_REDUCE = (
    "import time\n"
    "x = torch.ones(1) * (rank + 1)\n"
    "secret = rank * 10 + 7\n"
    "if rank == 1:\n"
    "    time.sleep(0.5)  # rank 0 is in the all_reduce before rank 1 pauses\n"
    "    breakpoint()\n"
    "dist.all_reduce(x)\n"
    "x.item()"
)


@dataclass
class Executed:
    """One cell's run: its reply, what it printed, each prompt and when each was asked."""

    reply: dict
    output: str = ""
    prompts: list[str] = field(default_factory=list)
    asked_at: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.reply["status"] == "ok"

    @property
    def error(self) -> str:
        return f"{self.reply.get('ename')}: {self.reply.get('evalue')}"


def execute(
    kc, code: str, answer: Callable[[str, Executed], str] | None = None, stdin: bool = True
) -> Executed:
    """Run `code` in the kernel; each input request is answered by `answer(prompt, so_far)`."""
    msg_id = kc.execute(code, allow_stdin=stdin)
    result: Executed | None = None
    output: list[str] = []
    prompts: list[str] = []
    asked: list[float] = []
    idle = False  # the kernel's idle status after this cell: every output message has come
    deadline = time.monotonic() + CELL_S
    while time.monotonic() < deadline:
        try:
            msg = kc.get_stdin_msg(timeout=0.02)
            prompts.append(msg["content"]["prompt"])
            asked.append(time.monotonic())
            assert answer is not None, f"unexpected prompt {prompts[-1]!r}; output so far:\n{''.join(output)}"
            kc.input(answer(prompts[-1], Executed({}, "".join(output), prompts, asked)))
        except queue.Empty:
            pass
        idle = _read_output(kc, msg_id, output) or idle
        try:
            reply = kc.get_shell_msg(timeout=0.02)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            result = Executed(reply["content"])
            break
    assert result is not None, f"the cell did not end within {CELL_S:g}s:\n{''.join(output)}"
    if not idle:
        _drain(kc, msg_id, output)
    result.output, result.prompts, result.asked_at = "".join(output), prompts, asked
    return result


def _read_output(kc, msg_id: str, output: list[str]) -> bool:
    """Take the iopub messages waiting now; True once the kernel went idle after this cell."""
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=0.01)
        except queue.Empty:
            return False
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            output.append(content["text"])
        elif kind == "error":
            output.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return True


def _drain(kc, msg_id: str, output: list[str]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _read_output(kc, msg_id, output):
        pass


def answers(*lines: str) -> Callable[[str, Executed], str]:
    pending = list(lines)
    return lambda prompt, so_far: pending.pop(0)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("debug-ranks")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        started = execute(
            kc,
            f"%load_ext ddp_helpers\n%ranks start --nproc 2 --backend gloo --run-dir {run_dir} --timeout 60",
        )
        assert started.ok, started.output
        yield kc
        execute(kc, "%ranks stop")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert_no_processes_left(str(run_dir))


def test_breakpoint_on_rank_1_while_rank_0_waits_in_an_all_reduce(kernel):
    def answer(prompt: str, so_far: Executed) -> str:
        return ["p secret", "ranks where", "c"][len(so_far.prompts) - 1]

    ran = execute(kernel, "%%ranks\n" + ALL_REDUCE, answer)
    assert ran.ok, ran.error + ran.output
    assert ran.prompts == [PROMPT] * 3, ran.prompts
    assert "-> dist.all_reduce(x)" in ran.output  # it stopped after breakpoint(), on the next line
    assert "\n17\n" in ran.output, ran.output  # `p secret` on rank 1: 1 * 10 + 7
    # `ranks where` at the prompt: rank 0 waits in the all_reduce, rank 1 is paused at it
    assert "rank 0, running" in ran.output and "rank 1, paused in pdb" in ran.output, ran.output
    assert ran.output.count("    dist.all_reduce(x)") == 2, ran.output
    assert ran.asked_at[2] - ran.asked_at[1] < 2.0  # every rank's stack within 2 s
    assert "[rank 0] Out: 3.0" in ran.output and "[rank 1] Out: 3.0" in ran.output, ran.output


def test_q_ends_the_cell_naming_the_rank_and_leaves_the_ranks_usable(kernel):
    ran = execute(kernel, "%%ranks\n" + ALL_REDUCE, answers("q"))
    assert not ran.ok and ran.reply["ename"] == "DebuggerQuit", ran.error
    assert "you quit the debugger on rank 1" in ran.reply["evalue"], ran.error
    after = execute(kernel, "%%ranks\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert after.ok and "[rank 1] Out: 2.0" in after.output, after.output


def test_a_pause_longer_than_the_collective_timeout_still_continues(kernel):
    short = (
        "%%ranks\nfrom datetime import timedelta\nc10d = dist.distributed_c10d\n"
        "set_timeout = getattr(c10d, 'set_timeout', None) or c10d._set_pg_timeout\n"
        "set_timeout(timedelta(seconds=2))\n"
        "c10d._get_default_group()._get_backend(torch.device('cpu')).options._timeout.total_seconds()"
    )
    assert "[rank 1] Out: 2.0" in execute(kernel, short).output

    def slow(prompt: str, so_far: Executed) -> str:
        time.sleep(4.0)  # twice the group's timeout: rank 0 waits in the all_reduce meanwhile
        return "c"

    ran = execute(kernel, "%%ranks\n" + ALL_REDUCE, slow)
    assert ran.ok, ran.error + ran.output
    assert "[rank 0] Out: 3.0" in ran.output, ran.output
    restored = execute(
        kernel,
        "%%ranks\nc10d._get_default_group()._get_backend(torch.device('cpu')).options._timeout.total_seconds()",
    )
    assert "[rank 0] Out: 2.0" in restored.output, restored.output  # the stretch ended with the cell
    execute(kernel, "%%ranks\nset_timeout(timedelta(minutes=30))")


def test_debug_flag_stops_one_rank_at_the_first_line_and_scripted_commands_run_headless(kernel):
    code = "%%ranks --debug 1 --pdb-commands 'n;; p y;; c'\ny = rank + 40\nz = y * 2\nz"
    ran = execute(kernel, code, stdin=False)  # as papermill runs it: no input box
    assert ran.ok, ran.error + ran.output
    assert f"{PROMPT}n" in ran.output and "\n41\n" in ran.output, ran.output
    assert "[rank 0] Out: 80" in ran.output and "[rank 1] Out: 82" in ran.output, ran.output
    assert ran.output.count("(Pdb)") == 3, ran.output  # rank 0 never stopped


def test_a_kernel_that_cannot_ask_says_how_to_script_the_commands(kernel):
    ran = execute(kernel, "%%ranks --debug 1\ny = 1", stdin=False)
    assert not ran.ok and ran.reply["ename"] == "DebuggerQuit", ran.error
    assert "cannot ask for input" in ran.reply["evalue"] and "--pdb-commands" in ran.reply["evalue"], (
        ran.error
    )
    assert "[rank 0] Out: 0" in execute(kernel, "%%ranks --rank 0\nrank").output


def test_pdb_set_trace_stops_the_rank_that_runs_it(kernel):
    code = "%%ranks\nimport pdb\nmine = rank + 100\nif rank == 1:\n    pdb.set_trace()\nmine"
    ran = execute(kernel, code, answers("p mine", "c"))
    assert ran.ok, ran.error + ran.output
    assert ran.prompts == [PROMPT, PROMPT] and "\n101\n" in ran.output, ran.output
    assert "[rank 0] Out: 100" in ran.output and "[rank 1] Out: 101" in ran.output, ran.output


def test_dist_breakpoint_on_rank_1(kernel):
    code = "%%ranks\nw = torch.tensor([float(rank)])\ndist.breakpoint(rank=1)\ndist.all_reduce(w)\nw.item()"
    ran = execute(kernel, code, answers("up", "p w.item()", "c"))
    assert ran.ok, ran.error + ran.output
    assert "Type 'up' to get to the frame that called dist.breakpoint(rank=1)" in ran.output, ran.output
    assert ran.prompts == [PROMPT] * 3 and "\n1.0\n" in ran.output, ran.output
    assert "[rank 0] Out: 1.0" in ran.output, ran.output


def test_ranks_debug_is_a_post_mortem_on_that_rank(kernel):
    failed = execute(kernel, "%%ranks\nlocal = rank * 3\n1 / (1 - rank)")
    assert not failed.ok and "ZeroDivisionError" in failed.error
    ran = execute(kernel, "%ranks debug 1", answers("p local", "q"))
    assert ran.ok, ran.error + ran.output
    assert "-> 1 / (1 - rank)" in ran.output and "\n3\n" in ran.output, ran.output
    where = execute(kernel, "%ranks where")
    assert "rank 0: between cells" in where.output and "rank 1: between cells" in where.output


# ------------------------------------------------------------------ the pieces, without ranks
def test_commands_split_on_pdbs_own_separator():
    assert split_commands("p x;; n ;;c") == ["p x", "n", "c"]
    assert split_commands(None) == []


def test_a_cell_that_may_pause_is_seen_before_it_runs():
    assert may_pause("if rank == 1:\n    breakpoint()")
    assert may_pause("import pdb; pdb.set_trace()") and may_pause("dist.breakpoint(rank=1)")
    assert not may_pause("x = breakpoints + 1")


def test_a_console_with_no_input_quits_and_says_why(capsys):
    def no_stdin(prompt: str) -> str:
        raise EOFError

    console = Console(["p x"], read=no_stdin)
    assert console.answer(1, Prompt(3, "> <cell 3>(2)\n", PROMPT)) == "p x"
    assert console.answer(1, Prompt(3, "7\n", PROMPT)) == "q"
    assert console.quit_rank == 1 and "cannot ask for input (end of input)" in console.quit_message(1)
    assert f"{PROMPT}p x" in capsys.readouterr().out


def _c10d(**members: object) -> types.ModuleType:
    """A stand-in for torch's distributed_c10d module that holds only `members`."""
    module = types.ModuleType("distributed_c10d")
    module.__dict__.update(members)
    return module


def test_the_timeout_setter_falls_back_to_torch_27s_name_then_to_none():
    calls = []
    setter = timeout_setter(_c10d(_set_pg_timeout=lambda t, g: calls.append((t, g))))
    assert setter is not None
    setter(timedelta(seconds=5), "group")
    assert calls == [(timedelta(seconds=5), "group")]
    assert timeout_setter(_c10d()) is None
    assert process_groups(_c10d(_get_default_group=lambda: "default")) == ["default"]


def test_a_group_whose_timeout_cannot_be_read_is_neither_stretched_nor_left_stretched(monkeypatch):
    set_to = []
    readable, unreadable = "readable", "unreadable"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # the module rank_debug asks
    monkeypatch.setattr(rank_debug, "timeout_setter", lambda: lambda t, g: set_to.append((g, t.seconds)))
    monkeypatch.setattr(rank_debug, "process_groups", lambda: [readable, unreadable])
    monkeypatch.setattr(
        rank_debug, "group_timeout", lambda g: timedelta(seconds=60) if g == readable else None
    )
    timeouts = rank_debug.Timeouts()
    assert timeouts.stretch(3600)
    timeouts.restore()
    assert set_to == [(readable, 3600), (readable, 60)]  # the unreadable group is never touched


def test_enter_at_a_pdb_prompt_is_not_a_quit():
    # it counted as `q`: the cell ended in DebuggerQuit although every rank finished
    console = Console(["n", "", "c"], read=lambda prompt: "")
    answers = [console.answer(1, Prompt(3, "", PROMPT)) for _ in range(4)]
    assert answers == ["n", "", "c", ""] and console.quit_rank is None
