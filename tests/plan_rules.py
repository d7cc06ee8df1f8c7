"""The machine shapes every notebook's plan is tested on, and the rules more than one notebook's plan keeps.

The shapes: GPUs per node in {0, 1, 2, 4, 8} x ranks per node in {1, 2, 3, 8} x nodes in {1, 2}, each at
full size and in smoke mode. A rule is a function of one plan that asserts; `every_shape("04", rule)`
runs it on notebook 04's plan for every shape and fails once, naming each shape that breaks it:

    def test_the_check_runs_two_ranks_at_least():
        def rule(plan: NotebookPlan) -> None:
            assert plan.runs["check"].nproc >= 2

        every_shape("00", rule)

No GPU is needed: a plan is computed from the counts alone (ddp_helpers/kernel/lab/plan_core.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ddp_helpers.backends import resolve_backend
from ddp_helpers.kernel.lab.plan_core import Machine, NotebookPlan, RunPlan, placement_line, plan_for

GPUS = (0, 1, 2, 4, 8)
NPROCS = (1, 2, 3, 8)
NODES = (1, 2)
SHAPES = [Machine(gpus, nproc, nodes) for gpus in GPUS for nproc in NPROCS for nodes in NODES]
ONE_NODE = [machine for machine in SHAPES if machine.nodes == 1]
KINDS = ("cpu", "cuda")
# The train worker's models (workers/train.py --model), from the least work per sample to the most
MODELS_BY_WORK = ("mlp", "resnet18", "resnet50")

T = TypeVar("T")
Rule = Callable[[NotebookPlan], object]
Case = tuple[str, NotebookPlan]  # a plan, and its shape's name


def shape_name(machine: Machine, smoke: bool = False) -> str:
    """'1 GPU x 2 ranks', '8 GPUs x 8 ranks x 2 nodes, smoke': a shape as a failure message names it."""
    name = f"{machine.gpus} GPU{'' if machine.gpus == 1 else 's'} x {machine.nproc} rank"
    name += "" if machine.nproc == 1 else "s"
    name += f" x {machine.nodes} nodes" if machine.nodes > 1 else ""
    return name + (", smoke" if smoke else "")


def for_each(cases: Iterable[tuple[str, T]], rule: Callable[[T], object]) -> None:
    """`rule` on every case; fails once, with each named case that broke it and how."""
    broken, count = [], 0
    for name, case in cases:
        count += 1
        try:
            rule(case)
        except AssertionError as error:
            broken.append(f"{name}: {error}")
    assert count, "no case to check"
    assert not broken, f"{len(broken)} of {count} shapes break the rule:\n" + "\n".join(broken)


def plans(notebook: str, shapes: Iterable[Machine] = SHAPES, **options: Any) -> list[Case]:
    """`notebook`'s plan for every shape, full size and smoke, each with its shape's name."""
    return [
        (shape_name(m, smoke), plan_for(notebook, m.gpus, m.nproc, m.nodes, smoke=smoke, **options))
        for m in shapes
        for smoke in (False, True)
    ]


def every_shape(notebook: str, rule: Rule, shapes: Iterable[Machine] = SHAPES, **options: Any) -> None:
    """`rule` holds for `notebook`'s plan on every shape, full size and smoke."""
    for_each(plans(notebook, shapes, **options), rule)


def sizes_by_kind(notebook: str) -> dict[tuple[str, bool], Mapping[str, Any]]:
    """`notebook`'s sizes by (device kind, smoke): one table each, whatever the counts (else it fails)."""
    found: dict[tuple[str, bool], Mapping[str, Any]] = {}
    for smoke in (False, True):
        for m in SHAPES:
            plan = plan_for(notebook, m.gpus, m.nproc, m.nodes, smoke=smoke)
            seen = found.setdefault((plan.device, smoke), plan.sizes)
            assert seen == plan.sizes, f"{shape_name(m, smoke)}: {dict(plan.sizes)}, elsewhere {dict(seen)}"
    return found


def visible_to(run: RunPlan, gpus: int) -> int:
    """GPUs each of the run's processes sees, after its env, on a node of `gpus` GPUs."""
    if "CUDA_VISIBLE_DEVICES" not in run.env:
        return gpus
    value = run.env["CUDA_VISIBLE_DEVICES"]
    return len(value.split(",")) if value else 0


def computes_where_planned(machine: Machine, run: RunPlan) -> None:
    """The backend rule the launcher and the workers share puts `run` on the device it plans, counting the
    node's GPUs or those its env leaves; NCCL only where every rank of the run has a GPU of its own."""
    seen = visible_to(run, machine.gpus)
    for gpus in (machine.gpus, seen):
        backend, device = resolve_backend(run.backend, gpus)
        assert device == run.device, f"{run}: {backend} on {gpus} GPU(s) computes on {device}"
    if run.device == "cuda":
        assert run.nproc <= seen, f"{run}: nccl with {run.nproc} ranks and {seen} GPU(s)"


def placed(machine: Machine, run: RunPlan, ranks: int, nodes: int = 1) -> None:
    """`run` is `ranks` ranks per node on `nodes` nodes, placed by the rule every notebook keeps: each
    rank on a GPU of its own (nccl) where the node has a GPU for each, else gloo on the CPU with every
    GPU hidden, so that nothing in the run reaches for one."""
    assert (run.nproc, run.nodes, run.devices) == (ranks, nodes, ranks), f"{run}: not {ranks} x {nodes}"
    own_gpus = machine.gpus >= ranks
    assert run.device == ("cuda" if own_gpus else "cpu"), f"{run}: {ranks} rank(s), {machine.gpus} GPU(s)"
    computes_where_planned(machine, run)
    if run.device == "cpu":
        assert visible_to(run, machine.gpus) == 0, f"{run}: a CPU run that sees GPUs"


def at_least_two(machine: Machine) -> int:
    """The ranks a demo that needs a second rank runs: those asked for, raised to two."""
    return max(machine.nproc, 2)


def says_why_it_runs_more(plan: NotebookPlan, run: RunPlan) -> None:
    """The plan's line says why, and where, `run` runs more ranks than were asked for, and only then."""
    more = run.nproc > plan.machine.nproc
    says = "nproc = " in plan.line or " two" in plan.line
    assert says == more, f"{run.nproc} ranks for nproc = {plan.machine.nproc}, and the line: {plan.line!r}"
    if more:
        assert placement_line(plan.machine, run) in plan.line, f"not where they run: {plan.line!r}"


def heavier(model: str, than: str) -> bool:
    """`model` does more work per sample than `than`."""
    return MODELS_BY_WORK.index(model) > MODELS_BY_WORK.index(than)


def option(args: list[str], name: str) -> list[str]:
    """The values after `name` in a worker's argument list, up to the next option."""
    assert name in args, f"{name} not in {args}"
    at, values = args.index(name) + 1, []
    while at < len(args) and not args[at].startswith("--"):
        values.append(args[at])
        at += 1
    return values
