"""The rank side of `LiveRanks.call`: a function called by name with real arguments, not code in a string.
The kernel pushes ``(target, args, kwargs, environ)``, then runs ``invoke(globals())`` on each rank."""

from __future__ import annotations

import builtins
import pkgutil
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
    """`target` (a dotted name) in `namespace` or builtins, as a cell sees it, else imported."""
    head, _, rest = target.partition(".")
    scope = {**vars(builtins), **namespace}
    if head in scope:
        found = scope[head]
        for part in rest.split(".") if rest else ():
            found = getattr(found, part)
    else:
        found = pkgutil.resolve_name(target)  # the longest module path that imports, then its attributes
    if not callable(found):
        raise TypeError(f"{target!r} is a {type(found).__name__}, not a function")
    function: Callable[..., Any] = found
    return function


def invoke(namespace: MutableMapping[str, Any]) -> Any:
    """Call what the kernel pushed as `PAYLOAD`, with `OnRank` arguments taken from `namespace`."""
    target, args, kwargs, environ = namespace.pop(PAYLOAD)

    def local(value: Any) -> Any:
        if isinstance(value, OnRank) and value.name not in namespace:
            raise NameError(f"OnRank({value.name!r}): name {value.name!r} is not defined on this rank")
        return namespace[value.name] if isinstance(value, OnRank) else value

    function = resolve(namespace, target)
    with environment(environ):
        return function(*map(local, args), **{k: local(v) for k, v in kwargs.items()})
