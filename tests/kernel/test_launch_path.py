"""One launch reads straight: following `launch()` from the call to the result visits each file at most twice.

The measurement is benchmarks/launch_path.py's; its docstring states the rule in full. In short: every
call of a package function on the launching thread is recorded (calls into the standard library or torch
are not followed); the reader then reads from `launch` down, each function once, its calls in the order
of their lines, and a *stop* is going into a function of another package file. Properties read in place.
A *visit* starts at a stop into a file that is not the one the reader has open at that depth
(``read_metrics`` then ``read_summary`` on the next line is one visit). A file visited a third time is
one the reader had to leave and open again twice: the launcher's code bounces between files.

The launches here start processes (torchrun, the ranks): make test-fast skips them, as test_launch.py's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fixtures import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "launch_path.py"
MAX_VISITS = 2


@pytest.fixture(scope="module")
def bench():
    return load_script("launch_path", BENCH)


@pytest.mark.parametrize("agent", ["forked", "fresh"])
def test_one_launch_visits_each_file_at_most_twice(bench, agent, tmp_path, monkeypatch):
    if agent == "fresh":  # no agent server: torchrun's agent starts as a new python
        monkeypatch.setenv("DDP_HELPERS_AGENT_SERVER", "off")
    path = bench.follow_launch(tmp_path / "run")
    stops = {(stop.file, stop.function) for stop in path.stops}
    # the story was followed from the call to the result, not cut short
    assert {
        ("kernel/launcher/runner.py", "launch"),
        ("kernel/launcher/processes.py", "start_run"),
        ("kernel/launcher/run_follower.py", "RunFollower.poll_files"),
        ("kernel/launcher/processes.py", "stop_despite_interrupts"),  # the run stopped
    } <= stops, path.report()
    bounced = {file: count for file, count in path.visits().items() if count > MAX_VISITS}
    assert not bounced, f"files visited more than {MAX_VISITS} times: {bounced}\n{path.report()}"


def _functions(bench, file: str, source: str) -> dict[str, object]:
    """The code of each function in `source`, as if written in the package's `file`."""
    module = compile(textwrap.dedent(source), str(bench.PACKAGE / file), "exec")
    return {code.co_name: code for code in module.co_consts if hasattr(code, "co_qualname")}


def test_the_rule_counts_a_file_left_and_opened_again_but_not_reading_on_in_it(bench):
    a = _functions(bench, "a.py", "def launch(): pass\ndef helper(): pass\n")
    b = _functions(bench, "b.py", "def first(): pass\ndef second(): pass\ndef later(): pass\n")
    c = _functions(bench, "c.py", "def deep(): pass\ndef other(): pass\n")
    recorder = bench.CallRecorder()
    recorder.calls = {  # caller -> {callee: the caller's line}, as recorded
        None: {a["launch"]: 0},
        a["launch"]: {b["first"]: 1, b["second"]: 2, c["other"]: 3, b["later"]: 4},
        b["first"]: {a["helper"]: 1},
        a["helper"]: {c["deep"]: 1},
        c["other"]: {a["helper"]: 1},  # read already: no stop
    }
    path = recorder.story()
    assert [(stop.file, stop.function, stop.depth, stop.new_visit) for stop in path.stops] == [
        ("a.py", "launch", 0, True),
        ("b.py", "first", 1, True),
        ("a.py", "helper", 2, True),  # back into a from b: a second visit to a
        ("c.py", "deep", 3, True),
        ("b.py", "second", 1, False),  # the next line, into b again: b is still open
        ("c.py", "other", 1, True),  # c was closed with b.first's reading
        ("b.py", "later", 1, True),  # b left for c, then opened again
    ]
    assert path.visits() == {"a.py": 2, "b.py": 2, "c.py": 2}
    assert path.revisits() == 3
