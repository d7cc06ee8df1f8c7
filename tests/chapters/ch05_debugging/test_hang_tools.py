"""The hang tools a learner takes to a cluster (ddp_helpers/chapters/ch05_debugging/ch05_hang_tools.py), on one planted hang.

One real torchrun job of the pitfalls worker's hang case on 3 gloo ranks (rank 1 sleeps; ranks 0 and 2
wait in an all_reduce), started with plain torchrun as on a cluster. Each tool must find the same thing:
rank 1 in its own code, every other rank in the all_reduce. A tool that this torch or this environment
lacks is skipped with the reason (py-spy not installed; the Flight Recorder's gloo records and the
debug server are torch 2.14's), and what torch 2.7 lacks is checked to be absent. The parsers are also
tested on fixed text, and the job must leave no process behind.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import psutil
import pytest

from ddp_helpers.chapters.ch05_debugging import ch05_hang_tools as hang_tools
from ddp_helpers.workers import worker_path

pytestmark = pytest.mark.xdist_group("test_hang_tools")

WORLD = 3  # an odd world: rank 1 is not simply "the other one"
WORKER = worker_path("pitfalls")
SLEEPING = "time.sleep(3600)"  # rank 1's line in the hang case
COLLECTIVE = "dist.all_reduce(x)"  # every other rank's


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """The planted hang, held for the module's tests; every process of it killed after them."""
    with hang_tools.planted_hang(WORKER, WORLD, tmp_path_factory.mktemp("hang") / "run") as job:
        yield job
    processes = []
    for pid in job.pids.values():
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"ranks still running after the job ended: {alive}"


def assert_found_the_hang(waits: dict[int, hang_tools.Wait], tool: str) -> None:
    assert sorted(waits) == list(range(WORLD)), f"{tool}: ranks {sorted(waits)}"
    assert waits[1].own_line == SLEEPING, f"{tool}: rank 1 at {waits[1]}"
    for rank in (0, 2):
        assert waits[rank] == hang_tools.Wait("all_reduce", COLLECTIVE), (
            f"{tool}: rank {rank} at {waits[rank]}"
        )


def test_the_job_hangs_with_a_pid_for_every_rank(hung):
    assert sorted(hung.pids) == list(range(WORLD))
    assert all(psutil.pid_exists(pid) for pid in hung.pids.values())
    assert hung.proc.poll() is None, "torchrun still waits for its ranks"


def test_py_spy_names_where_each_rank_waits(hung):
    if hang_tools.py_spy() is None:
        pytest.skip("py-spy is not installed (pip install py-spy: the test extra has it)")
    dumps = hang_tools.py_spy_dumps(hung)
    assert all(dump.startswith("Process ") for dump in dumps.values()), dumps
    assert_found_the_hang(hang_tools.py_spy_waits(dumps, WORKER), "py-spy")


def test_flight_recorder_names_the_rank_missing_from_the_all_reduce(hung):
    if not hang_tools.flight_recorder_dumps_gloo():
        assert not hang_tools.fr_trace_available(), "torch 2.7 ships no fr_trace module either"
        pytest.skip("this torch's Flight Recorder records NCCL only (torch 2.14 records gloo's collectives)")
    files = hang_tools.dump_flight_recorder(hung)
    assert sorted(files) == list(range(WORLD))
    records = {rank: pickle.loads(path.read_bytes()) for rank, path in files.items()}
    enqueued = {
        rank: [e["profiling_name"] for e in r["entries"] if not e["retired"]] for rank, r in records.items()
    }
    assert enqueued == {0: ["gloo:all_reduce"], 1: [], 2: ["gloo:all_reduce"]}, enqueued
    named = hang_tools.name_gloo_groups(hung.fr_dir, hung.run_dir / "fr-named")
    assert named == ["0"], "the default group's ranks are filed under its name"
    report = hang_tools.run_fr_trace(hung.run_dir / "fr-named")
    assert report.returncode == 0, report.stdout[-2000:]
    finding = hang_tools.fr_trace_finding(report.stdout)
    assert finding == ("gloo:all_reduce", frozenset({1})), report.stdout[-2000:]


def test_the_debug_server_stacks_page_names_where_each_rank_waits(hung):
    missing = hang_tools.missing_for_debug_server()
    if missing:
        pytest.skip(f"the debug server needs {', '.join(missing)} (pip install {' '.join(missing)})")
    stacks = hang_tools.debug_server_stacks(hang_tools.debug_server_page(hung))
    assert_found_the_hang(hang_tools.faulthandler_waits(stacks, WORKER), "debug server")


def test_a_plain_job_carries_no_tools_and_leaves_nothing_running(tmp_path):
    with hang_tools.planted_hang(WORKER, 2, tmp_path / "plain", with_tools=False) as job:
        commands = {rank: " ".join(psutil.Process(pid).cmdline()) for rank, pid in job.pids.items()}
        assert all("with_tools.py" not in command for command in commands.values()), commands
        assert job.debug_port is None
        processes = [psutil.Process(job.proc.pid), *psutil.Process(job.proc.pid).children(recursive=True)]
    assert not hang_tools.still_running(job.pids)
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"still running after the block: {alive}"


# ---- the parsers, on fixed text --------------------------------------------------------------------

PY_SPY = """Process 11: python -u with_tools.py pitfalls.py --case hang
Python v3.11.7 (/usr/bin/python3.11)

Thread 11 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3913)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    hang (ddp_helpers/chapters/ch05_debugging/pitfalls.py:{line})
    main (ddp_helpers/chapters/ch05_debugging/pitfalls.py:366)
Thread 12 (idle): "Thread-1 (dump_flight_recorder_on_signal)"
    sigwait (signal.py:82)
"""


def test_py_spy_waits_reads_the_main_thread_innermost_first():
    line = 1 + WORKER.read_text().splitlines().index(f"    {COLLECTIVE}")
    waits = hang_tools.py_spy_waits({0: PY_SPY.format(line=line)}, WORKER)
    assert waits == {0: hang_tools.Wait("all_reduce", COLLECTIVE)}


def test_py_spy_waits_reads_a_dump_in_colour():
    line = 1 + WORKER.read_text().splitlines().index(
        "        time.sleep(3600)  # ...and never reaches the collective that the other ranks wait in"
    )
    coloured = (
        PY_SPY.format(line=line)
        .replace("hang (", "\x1b[32mhang\x1b[0m (\x1b[36m")
        .replace("pitfalls.py:", "pitfalls.py\x1b[0m:\x1b[2m")
    )
    waits = hang_tools.py_spy_waits({1: coloured}, WORKER)
    assert waits[1].own_line == SLEEPING, waits


def test_fr_trace_finding_reads_the_collective_and_the_missing_ranks():
    report = "Not all ranks joining collective, sequence number: 1\ncollective: gloo:all_reduce\nmissing ranks: {1, 3}\n"
    assert hang_tools.fr_trace_finding(report) == ("gloo:all_reduce", frozenset({1, 3}))
    assert hang_tools.fr_trace_finding("no mismatch found\n") is None


def test_name_gloo_groups_files_the_ranks_under_the_groups_name(tmp_path):
    record = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "entries": [{"process_group": ("0", "default_pg")}],
    }
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "fr_rank_0").write_bytes(pickle.dumps(record))
    assert hang_tools.name_gloo_groups(tmp_path / "fr", tmp_path / "named") == ["0"]
    fixed = pickle.loads((tmp_path / "named" / "fr_rank_0").read_bytes())
    assert fixed["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}


def test_debug_server_stacks_reads_each_ranks_section():
    page = (
        "<h2>Rank 0: http://host:1/handler/dump_traceback?</h2>\n<pre>Thread 0x0a (most recent call first):\n"
        '  File "/x/pitfalls.py", line 3 in hang\n</pre>\n<h2>Rank 1: http://host:2/h</h2>\n<pre>&lt;no&gt;</pre>'
    )
    stacks = hang_tools.debug_server_stacks(page)
    assert sorted(stacks) == [0, 1] and stacks[1] == "<no>"
    assert "line 3 in hang" in stacks[0]


def test_with_tools_is_the_script_the_job_runs(tmp_path):
    assert "signal.sigwait" in hang_tools.WITH_TOOLS and "start_debug_server" in hang_tools.WITH_TOOLS
    compile(hang_tools.WITH_TOOLS, str(Path("with_tools.py")), "exec")  # valid Python
