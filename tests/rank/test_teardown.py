"""The workers' teardown: destroy_process_group on nccl; on gloo, an exit without finalization."""

from __future__ import annotations

import os

import torch.distributed as dist

from ddp_helpers.rank import teardown


def test_without_a_process_group_it_does_nothing(monkeypatch):
    done: list[str] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda *args, **kwargs: done.append("destroyed"))
    monkeypatch.setattr(os, "_exit", lambda code: done.append(f"exited with {code}"))
    assert not dist.is_initialized()  # init_process_group never ran in this process
    teardown.destroy_process_group()  # must not raise
    assert done == []  # no group destroyed, and the process goes on
