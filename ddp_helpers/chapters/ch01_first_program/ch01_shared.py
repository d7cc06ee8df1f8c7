"""What the exercises of notebook 01 share: DistributedSampler's deal written out, and mistakes' signatures."""

from __future__ import annotations

from typing import Any

from ddp_helpers.rank.spec import Seen, field_of


def _every_rank_drew_all(size: int) -> Any:
    def matches(seen: Seen, expected: Seen) -> bool:
        drawn = field_of(seen, "drawn")
        return len(seen) > 1 and all(d and all(sorted(p) == list(range(size)) for p in d) for d in drawn)

    return matches


def _epochs_repeat(seen: Seen, expected: Seen) -> bool:
    drawn = field_of(seen, "drawn")
    return all(d and len(d) == 2 and d[1] == d[0] for d in drawn)


def _every_rank(name: str) -> Any:
    return lambda seen, expected: len(seen) > 1 and all(s.get(name) for s in seen)


def _module_keys(seen: Seen, expected: Seen) -> bool:
    return any(k.startswith("module.") for k in (seen[0].get("file_keys") or []))


def _not_saved(seen: Seen, expected: Seen) -> bool:
    return seen[0].get("file_keys") is None and not seen[0].get("error")


def node_layouts(seen: Seen) -> list[dict[str, int]] | None:
    """Each rank's place on the pretend nodes its answer ran on (rank_side.node_layout: LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK ...), or None where the answer ran as the machine is, on one node."""
    layouts = field_of(seen, "node layout")
    return layouts if len(seen) > 1 and all(layouts) else None


def _first_of_each_node(name: str) -> Any:
    """The ranks that did `name` (saved, printed) are the first of each node, LOCAL_RANK 0: a guard on
    LOCAL_RANK, where RANK belongs. Named apart from "every rank" only where a node holds two ranks."""

    def matches(seen: Seen, expected: Seen) -> bool:
        layouts = node_layouts(seen)
        if layouts is None:
            return False
        firsts = [layout["LOCAL_RANK"] == 0 for layout in layouts]
        return 1 < sum(firsts) < len(seen) and [bool(s.get(name)) for s in seen] == firsts

    return matches


def sampler_order(size: int, world: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    """DistributedSampler's indices for `rank`, written out: a permutation seeded with seed + epoch, padded
    with its own start to a multiple of the world, then every world-th from position `rank`."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(size, generator=generator).tolist()
    total = -(-size // world) * world
    order += order[: total - size]
    return order[rank:total:world]
