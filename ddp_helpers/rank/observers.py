"""Rank side: what an answer did, seen from outside its code."""

from __future__ import annotations

import functools
import io
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

COLLECTIVES = (
    "all_reduce all_gather all_gather_into_tensor all_gather_object broadcast broadcast_object_list".split()
)
COLLECTIVES += ["reduce", "reduce_scatter_tensor", "barrier"]


class RecordingDataset(Dataset):
    """A dataset that writes down every index it is asked for, one list per pass over a loader."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors
        self.passes: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        if not self.passes:
            self.passes.append([])
        self.passes[-1].append(int(index))
        return tuple(t[index] for t in self.tensors)

    def new_pass(self) -> None:
        self.passes.append([])


class Observers:
    """Patch the collectives, ``torch.save``, ``torch.load`` and ``DataLoader.__iter__`` for a ``with``."""

    def __init__(self) -> None:
        self.collectives: list[str] = []
        self.saves: list[str] = []
        self.loads: list[bool] = []  # per torch.load of a file: was a map_location given?
        self._undo: list[tuple[Any, str, Any]] = []

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def __enter__(self) -> Observers:
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name, self._recorded(name, getattr(dist, name)))
        real_save = torch.save

        @functools.wraps(real_save)
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(f, io.BytesIO):  # a tensor pickled for all_gather_object: not a file
                self.saves.append(str(f))
            return real_save(obj, f, *args, **kwargs)

        self._patch(torch, "save", save)
        real_load = torch.load

        @functools.wraps(real_load)
        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(f, io.BytesIO):  # map_location is torch.load's second parameter
                self.loads.append(
                    bool(args) and args[0] is not None or kwargs.get("map_location") is not None
                )
            return real_load(f, *args, **kwargs)

        self._patch(torch, "load", load)
        real_iter = DataLoader.__iter__

        def loader_iter(loader: DataLoader) -> Any:
            if isinstance(loader.dataset, RecordingDataset):
                loader.dataset.new_pass()  # a new iter() is a new epoch
            return real_iter(loader)

        self._patch(DataLoader, "__iter__", loader_iter)
        return self

    def _recorded(self, name: str, real: Any) -> Any:
        @functools.wraps(real)
        def call(*args: Any, **kwargs: Any) -> Any:
            self.collectives.append(name)
            return real(*args, **kwargs)

        return call

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
