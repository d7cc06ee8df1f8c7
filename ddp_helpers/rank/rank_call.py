"""The rank side of `LiveRanks.call`: a function called by name with real arguments, not code in a string."""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ddp_helpers.rank.spec import environment

PAYLOAD = "_ddp_helpers_call"  # the pushed name: one the learner's cells would not choose


@dataclass(frozen=True)
class OnRank:
    """An argument of `LiveRanks.call` that each rank takes from its own namespace: ``OnRank("mesh")``."""

    name: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"OnRank takes a variable name, got {self.name!r}")


def resolve(namespace: Mapping[str, Any], target: str) -> Callable[..., Any]:
    """`target` (a dotted name) in `namespace`, else from the longest module path that imports."""
    parts = target.split(".")
    if parts[0] in namespace:
        found, rest = namespace[parts[0]], parts[1:]
    elif hasattr(builtins, parts[0]):  # len, print: as a cell would see them
        found, rest = getattr(builtins, parts[0]), parts[1:]
    else:
        for cut in range(len(parts) - 1, 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            rest = parts[cut:]
            break
        else:
            raise NameError(
                f"{target!r}: {parts[0]!r} is not defined on this rank, nor a module it can import"
            )
    for part in rest:
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{target!r} is a {type(found).__name__}, not a function")
    function: Callable[..., Any] = found
    return function


def invoke(namespace: MutableMapping[str, Any]) -> Any:
    """Call what the kernel pushed as `PAYLOAD`, with `OnRank` arguments taken from `namespace`."""
    target, args, kwargs, environ = namespace.pop(PAYLOAD)

    def local(value: Any) -> Any:
        if not isinstance(value, OnRank):
            return value
        if value.name not in namespace:
            raise NameError(f"OnRank({value.name!r}): name {value.name!r} is not defined on this rank")
        return namespace[value.name]

    function = resolve(namespace, target)
    with environment(environ):
        return function(*map(local, args), **{k: local(v) for k, v in kwargs.items()})
