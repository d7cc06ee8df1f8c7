"""Exercises on real live ranks: each reference answer passes at 1 and 3 ranks (at 2 in the lessons' own runs); each catalogued wrong
answer (a mutant with a `diagnosis`) gets its own diagnosis; the starter and an empty answer never pass;
a hang ends within the bound with fresh ranks; and the catalogue covers the capstone's lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import load_script

from ddp_helpers import start_ranks
from ddp_helpers.kernel.exercises.checker import check
from ddp_helpers.kernel.exercises.verdict import HUNG
from ddp_helpers.kernel.live.ranks import LiveRanks
from ddp_helpers.rank.lines import LINES
from ddp_helpers.rank.registry import all_exercises, get
from ddp_helpers.rank.spec import Exercise
from ddp_helpers.workers import worker_path

ROOT = Path(__file__).resolve().parents[2]
runner = load_script("mutant_runner_for_exercises", ROOT / "mutants" / "run.py")

EXERCISES = all_exercises()
IDS = {e.id for e in EXERCISES}
# the capstone's wrong scripts are checked under torchrun, in tests/chapters/ch10_capstone/test_capstone.py
WRONG_ANSWERS = [m for m in runner.load_catalogue() if m.exercise in IDS]
WRONG_NPROC = 2  # the world a wrong answer is checked at, unless its mutant names others

# one set of live ranks per world size, started once for the module: one xdist worker runs it all
pytestmark = pytest.mark.xdist_group("test_exercises")
_started: dict[int, LiveRanks] = {}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    def ranks_of(nproc: int) -> LiveRanks:
        if nproc not in _started:
            _started[nproc] = start_ranks(nproc=nproc, run_dir=tmp_path_factory.mktemp(f"ranks{nproc}"))
        return _started[nproc]

    yield ranks_of
    for ranks in _started.values():
        ranks.shutdown()
    _started.clear()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("exercises")


def wrong_answer(mutant) -> str:
    """The exercise's reference answer as the mutant leaves it: its edit made in the module's source text
    (as make mutants makes it, so an edit may span the lines of the reference's string literal), that
    source run as the module, and the exercise's reference read from it."""
    path = ROOT / mutant.file
    source = path.read_text()
    assert source.count(mutant.old) == 1, f"{mutant.name}: `old` must occur once in {mutant.file}"
    package = ".".join(path.relative_to(ROOT).parent.parts)  # relative imports resolve as in the real module
    namespace: dict[str, object] = {
        "__name__": f"{package}._mutated_{path.stem}",
        "__package__": package,
        "__file__": str(path),
    }
    exec(compile(source.replace(mutant.old, mutant.new), str(path), "exec"), namespace)
    found = {v.id: v for v in namespace.values() if isinstance(v, Exercise) and v.id == mutant.exercise}
    (exercise,) = found.values()
    assert exercise.reference != get(mutant.exercise).reference, (
        f"{mutant.name} leaves the reference as it was"
    )
    return exercise.reference


# ------------------------------------------------------------------ no ranks needed
def test_the_catalogue_loads_without_torch():
    """The command line refuses bad input within a second: the catalogue must not import torch."""
    code = (
        "import sys, ddp_helpers.rank.registry as e; e.all_exercises(); "
        "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_notebook_00_to_09_has_two_exercises():
    per_notebook = {f"{n:02d}": [e.id for e in EXERCISES if e.notebook == f"{n:02d}"] for n in range(0, 10)}
    few = {nb: ids for nb, ids in per_notebook.items() if len(ids) < 2}
    assert not few, f"notebooks with fewer than two exercises: {few}"


def test_ids_are_unique_and_name_their_notebook():
    ids = [e.id for e in EXERCISES]
    assert len(ids) == len(set(ids)), ids
    assert all(e.id.startswith(f"{e.notebook}-") for e in EXERCISES), ids


def test_the_exercises_cover_every_line_of_the_capstone():
    covered = {line for e in EXERCISES for line in e.covers}
    unknown = covered - set(LINES)
    assert not unknown, f"covers names lines that lines.py does not list: {sorted(unknown)}"
    missing = set(LINES) - covered
    assert not missing, f"no exercise has the learner write: {sorted(missing)}"


def test_every_mistake_is_a_catalogued_mutant_and_back():
    mistakes = {m.id: e.id for e in EXERCISES for m in e.mistakes}
    catalogued = {m.diagnosis: m.exercise for m in WRONG_ANSWERS}
    strays = [
        m.name for m in runner.load_catalogue() if m.exercise and m.exercise not in IDS | {"10-capstone"}
    ]
    assert not strays, f"mutants naming no exercise: {strays}"
    assert set(mistakes) <= set(catalogued), (
        f"mistakes with no mutant: {sorted(set(mistakes) - set(catalogued))}"
    )
    assert catalogued.items() <= mistakes.items(), "a mutant names a mistake of another exercise, or none"


@pytest.mark.parametrize("mutant", WRONG_ANSWERS, ids=lambda m: m.name)
def test_a_wrong_answer_mutant_changes_the_reference_in_its_file(mutant):
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.name}: old must occur once in {mutant.file}"
    wrong_answer(mutant)


# ------------------------------------------------------------------ on live ranks
# at 1 and 3 ranks: at 2, every lesson's smoke run checks its references (solutions=True, tests/test_notebooks.py)
@pytest.mark.parametrize("nproc", [1, 3])
def test_every_reference_passes(nproc, live, workdir):
    ranks = live(nproc)
    failed = {}
    for exercise in EXERCISES:
        verdict = check(exercise.id, exercise.reference, ranks, workdir=workdir)
        if not verdict.passed:
            failed[exercise.id] = verdict.text()
    assert not failed, "\n\n".join(failed.values())


# The wrong answers, over 130, are shared between two more xdist groups: each worker that takes one
# starts live ranks of its own, so that make test's three workers check them side by side.
@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(m, marks=pytest.mark.xdist_group(f"test_exercises_{i % 2}"))
        for i, m in enumerate(WRONG_ANSWERS)
    ],
    ids=lambda m: m.name,
)
def test_a_catalogued_wrong_answer_gets_its_own_diagnosis(mutant, live, workdir):
    nproc = max(mutant.nproc) if mutant.nproc and max(mutant.nproc) > 1 else WRONG_NPROC
    verdict = check(mutant.exercise, wrong_answer(mutant), live(min(nproc, 3)), workdir=workdir)
    assert verdict.diagnosis == mutant.diagnosis, verdict.text()
    assert not verdict.passed and verdict.seen, verdict.text()


def test_a_hung_answer_ends_within_its_bound_with_stacks_and_fresh_ranks(live, workdir):
    exercise = get("01-shard")
    ranks = live(2)
    verdict = check("01-shard", "if rank == 0:\n    dist.barrier()\n", ranks, workdir=workdir, timeout=5.0)
    assert verdict.diagnosis == HUNG, verdict.text()
    assert "<your answer>" in verdict.message and "barrier" in verdict.message, verdict.message
    assert verdict.message.startswith(
        "a collective only some ranks call: rank 0 waits in `barrier` at line 2 of your answer, "
        "which rank(s) 1 never called"
    ), verdict.message
    assert ranks.alive, "the ranks must be ready for the next try"
    again = check("01-shard", exercise.reference, ranks, workdir=workdir)
    assert again.passed, again.text()


def test_a_mark_made_before_the_move_is_named_and_the_watch_on_mark_dynamic_is_undone(live, workdir):
    """On a CPU the answer's device is cpu:0, so that x.to(device) copies as a move to a GPU does: a mark on the
    loader's tensor misses the one the model gets. The probe's watch on mark_dynamic is gone afterwards."""
    ranks = live(2)
    answer = """
sampler = DistributedSampler(dataset, shuffle=False)
loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
seen = torch.zeros((), dtype=torch.int64, device=device)
for (x,) in loader:
    torch._dynamo.mark_dynamic(x, 0)
    ddp_model(x.to(device)).sum().backward()
    seen += len(x)
dist.all_reduce(seen)
samples = int(seen)
"""
    verdict = check("09-last-batch", answer, ranks, workdir=workdir)
    assert verdict.diagnosis == "09-last-batch-marked-before-move", verdict.text()
    assert ranks.run("hasattr(torch._dynamo.mark_dynamic, '__wrapped__')") == {0: False, 1: False}
    assert check("09-last-batch", get("09-last-batch").reference, ranks, workdir=workdir).passed


def test_the_pretend_nodes_are_laid_out_as_torchrun_lays_them_out():
    """Exercise.nodes=2: ranks dealt to the nodes in order, ceil(world / 2) per node; one rank has no nodes."""
    from ddp_helpers.rank.answer_runner import node_layout

    def local_ranks(world: int) -> list[int] | None:
        layouts = [node_layout(r, world, 2) for r in range(world)]
        return None if layouts[0] is None else [layout["LOCAL_RANK"] for layout in layouts if layout]

    assert local_ranks(1) is None
    assert local_ranks(2) == [0, 0] and local_ranks(3) == [0, 1, 0] and local_ranks(8) == [0, 1, 2, 3] * 2
    assert node_layout(2, 3, 2) == {
        "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "GROUP_RANK": 1, "GROUP_WORLD_SIZE": 2,
        "ROLE_RANK": 2, "ROLE_WORLD_SIZE": 3,
    }  # fmt: skip
    assert {e.id for e in EXERCISES if e.nodes == 2} >= {"01-convert", "01-shard", "01-wrap", "04-save"}


def test_a_two_node_probe_leaves_the_ranks_environment_as_it_was(live, workdir):
    ranks = live(3)
    names = "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"
    ask = f"import os\n[os.environ.get(n) for n in {names!r}]"
    before = ranks.run(ask)
    # the answer sees node 1's rank 2 as LOCAL_RANK 0, in `local_rank`, os.environ and get_node_local_rank()
    answer = (
        "here = (local_rank, dist.get_node_local_rank(), int(os.environ['GROUP_RANK']))\n"
        "assert here == [(0, 0, 0), (1, 1, 0), (0, 0, 1)][rank], here\n"
    ) + get("01-shard").reference
    verdict = check("01-shard", answer, ranks, workdir=workdir)
    assert verdict.passed, verdict.text()
    assert ranks.run(ask) == before, "the pretend layout must be undone after the answer"


def test_a_long_difference_is_shown_where_it_differs():
    """01-convert's drawn indices: the epoch that differs is shown whole, not cut off before it differs."""
    from ddp_helpers.kernel.exercises.verdict import Verdict

    epoch0, epoch1 = list(range(40, 17, -1)), list(range(23))
    difference = {"rank": 0, "field": "drawn", "seen": [epoch0, epoch0], "expected": [epoch0, epoch1]}
    text = Verdict(
        "01-convert", False, "x", "m", differences=[difference], seen=[{"drawn": [epoch0, epoch0]}]
    ).text()
    assert "drawn[1]" in text and repr(epoch1) in text and "drawn[0]" not in text, text
    long = {"rank": 1, "field": "weight", "seen": [0.5] * 30 + [1.0], "expected": [0.5] * 31}
    text = Verdict("01-convert", False, "x", "m", differences=[long]).text()
    assert "1.0" in text and "31 in all" in text, text


def test_a_hang_is_named_only_when_some_ranks_finished_and_the_rest_wait_in_the_answer():
    from ddp_helpers.errors import LaunchTimeout
    from ddp_helpers.kernel.exercises.checker import one_sided_collective

    def stack(*frames: tuple[str, int, str]) -> str:
        return "\n".join(f'  File "{f}", line {n} in {name}' for f, n, name in frames)

    in_barrier = stack(
        ("/t/torch/distributed/distributed_c10d.py", 9, "barrier"), ("<your answer>", 4, "<module>")
    )
    elsewhere = stack(("/t/torch/serialization.py", 9, "save"), ("/t/site.py", 4, "<module>"))
    one = LaunchTimeout("hung", silent_ranks=[0], stacks={0: in_barrier})
    assert "rank 0 waits in `barrier` at line 4 of your answer, which rank(s) 1, 2 never" in (
        one_sided_collective(one, 3) or ""
    )
    every = LaunchTimeout("hung", silent_ranks=[0, 1], stacks={0: in_barrier, 1: in_barrier})
    assert one_sided_collective(every, 2) is None, "no rank finished: nothing says the call was one-sided"
    in_backward = stack(("/t/torch/autograd/__init__.py", 9, "backward"), ("<your answer>", 6, "<module>"))
    skipped = LaunchTimeout("hung", silent_ranks=[0], stacks={0: in_backward})
    assert "rank 0 waits in `backward()` (DDP's all-reduce of the gradients) at line 6" in (
        one_sided_collective(skipped, 2) or ""
    )
    unknown = LaunchTimeout("hung", silent_ranks=[0], stacks={0: elsewhere})
    assert one_sided_collective(unknown, 2) is None, "a rank stuck outside the answer is not named"


def test_a_rank_gloo_stopped_for_a_collective_mismatch_is_named():
    from ddp_helpers.kernel.exercises.checker import collective_mismatch

    gloo = "op.preamble.length <= op.nbytes. 16 vs 4. Received data size doesn't match expected size."
    assert "one rank skipped a collective the others made" in (collective_mismatch(gloo) or "")
    assert collective_mismatch("RuntimeError: CUDA out of memory") is None


def test_a_verdict_is_one_json_object():
    from ddp_helpers.kernel.exercises.checker import judge

    verdict = judge(get("01-shard"), [{"rank": 0, "error": None, "drawn": []}])
    data = json.loads(verdict.to_json())
    assert {"exercise", "passed", "diagnosis", "message"} <= data.keys() and data["passed"] is False


def test_a_verdict_shows_nan_and_inf_as_themselves_in_its_text_and_its_json():
    from ddp_helpers.kernel.exercises.checker import judge

    weight = [float("nan"), float("inf"), -float("inf")] + [0.0] * 5
    verdict = judge(get("05-nan-skip"), [{"rank": 0, "error": None, "steps_taken": [0], "weight": weight}])
    assert "weight=[nan, inf, -inf, 0.0" in verdict.text(), verdict.text()
    strict = json.loads(verdict.to_json(), parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))
    assert strict["seen"][0]["weight"][:3] == ["nan", "inf", "-inf"], strict["seen"]


@pytest.mark.parametrize(
    ("exercise", "answer", "note"),
    [
        (  # right, but the hook waits for its all-reduce: nothing overlaps backward
            "07-hook",
            "def hook(state, bucket):\n"
            "    buffer = bucket.buffer().div_(dist.get_world_size())\n"
            "    dist.all_reduce(buffer)\n"
            "    future = torch.futures.Future()\n"
            "    future.set_result(buffer)\n"
            "    return future\n"
            "ddp_model.register_comm_hook(None, hook)\n"
            "ddp_model(x).sum().backward()\n"
            "optimizer.step()\n",
            "it waited for its all-reduce",
        ),
        (  # right, with a GradScaler that bf16 does not need
            "03-bf16",
            "scaler = torch.amp.GradScaler(device.type)\n"
            "with torch.autocast(device.type, dtype=torch.bfloat16):\n"
            "    loss = F.cross_entropy(ddp_model(x), y)\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            "only fp16 needs one",
        ),
    ],
    ids=["07-hook-blocking", "03-bf16-grad-scaler"],
)
def test_a_right_but_costly_answer_passes_with_a_note(exercise, answer, note, live, workdir):
    verdict = check(exercise, answer, live(2), workdir=workdir)
    assert verdict.passed and "Note: " in verdict.message and note in verdict.message, verdict.text()
    plain = check(exercise, get(exercise).reference, live(2), workdir=workdir)
    assert plain.passed and "Note:" not in plain.message, plain.text()


def test_a_named_mistake_gives_its_own_hint_and_no_hint_repeats_what_the_learner_did():
    from dataclasses import replace

    from ddp_helpers.kernel.exercises.checker import judge
    from ddp_helpers.rank.spec import Mistake

    exercise = get("01-shard")
    always = Mistake(
        "01-test-always", "always matches", lambda seen, expected: True, hint="do the other thing"
    )
    verdict = judge(replace(exercise, mistakes=(always,)), [{"rank": 0, "error": None, "drawn": []}])
    assert (verdict.diagnosis, verdict.hint) == ("01-test-always", "do the other thing"), verdict.text()
    plain = Mistake("01-test-plain", "always matches", lambda seen, expected: True)
    verdict = judge(replace(exercise, mistakes=(plain,)), [{"rank": 0, "error": None, "drawn": []}])
    assert verdict.hint == exercise.hint, "a mistake with no hint of its own falls back to the exercise's"
    for each in EXERCISES:
        for mistake in each.mistakes:
            assert mistake.hint != mistake.message, f"{mistake.id}: its hint only repeats its message"


# ------------------------------------------------------------------ the command line
def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddp_helpers", "exercises", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_command_line_lists_and_shows_a_solution():
    listed = json.loads(_cli("list", "--json").stdout)
    assert [row["id"] for row in listed] == [e.id for e in EXERCISES] + ["10-capstone"]
    assert _cli("solution", "01-wrap").stdout == get("01-wrap").reference


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("check", "99-nothing", "FILE"), "no exercise '99-nothing'"),
        (("check", "01-wrap", "MISSING"), "no such file"),
        (("check", "01-wrap", "BAD"), "syntax error at line 1"),
        (("check", "01-wrap", "FILE", "--nproc", "0"), "--nproc must be 1 to 8"),
        (("solution", "01-nothing"), "no exercise '01-nothing'"),
        (("check-script", "MISSING"), "no such file"),
        (("check-script", "BAD"), "syntax error at line 1"),
    ],
)
def test_the_command_line_refuses_bad_input_before_any_rank(args, said, tmp_path):
    (tmp_path / "answer.py").write_text("x = 1\n")
    (tmp_path / "bad.py").write_text("x = (\n")
    paths = {
        "FILE": str(tmp_path / "answer.py"),
        "BAD": str(tmp_path / "bad.py"),
        "MISSING": str(tmp_path / "no.py"),
    }
    out = _cli(*[paths.get(a, a) for a in args], timeout=20)
    assert out.returncode == 2 and said in out.stderr, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr


def test_the_command_line_checks_an_answer_file_and_ends_with_one_json_object(tmp_path):
    answer = tmp_path / "answer.py"
    answer.write_text(
        get("01-shard").reference.replace("    sampler.set_epoch(epoch)  # shuffles", "    pass  #")
    )
    out = _cli("check", "01-shard", str(answer), "--nproc", "2", "--json")
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1, out.stderr
    assert (verdict["exercise"], verdict["passed"], verdict["diagnosis"]) == (
        "01-shard",
        False,
        "01-shard-no-set-epoch",
    )


def test_an_answer_that_raises_on_one_rank_while_the_other_waits_ends_in_seconds(live, workdir):
    ranks = live(2)
    answer = "if rank == 1:\n    raise ValueError('rank 1 gave up')\ndist.barrier()\n"
    verdict = check("01-shard", answer, ranks, workdir=workdir)
    assert verdict.diagnosis == "raised" and "rank 1 failed: ValueError: rank 1 gave up" in verdict.message
    assert "rank 0 was still in the cell" in verdict.message, verdict.message
    assert ranks.alive and check("01-shard", get("01-shard").reference, ranks, workdir=workdir).passed


def test_the_capstone_is_listed_and_its_solution_is_the_reference_script():
    listed = json.loads(_cli("list", "--json").stdout)
    assert listed[-1]["id"] == "10-capstone", listed[-1]
    shown = _cli("solution", "10-capstone").stdout
    assert shown == worker_path("capstone").read_text()
    refused = _cli("check", "10-capstone", __file__, timeout=20)
    assert refused.returncode == 2 and "check-script" in refused.stderr, refused.stderr
