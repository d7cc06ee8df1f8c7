"""The worker's own backend rule (ddp_helpers/distributed.worker_backend), as a plain torchrun meets it:
no DDP_BACKEND from the launcher, the GPUs torch sees, and LOCAL_WORLD_SIZE ranks on this node."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ddp_helpers.rank.distributed import worker_backend


@pytest.fixture
def torch_sees_gpus(monkeypatch) -> Callable[[int], None]:
    """``torch_sees_gpus(n)``: torch.cuda shows n GPUs, and no launcher has chosen a backend (no DDP_BACKEND)."""

    def visible(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    monkeypatch.delenv("DDP_BACKEND", raising=False)
    return visible


@pytest.mark.parametrize(
    ("count", "local_ranks", "expected"),
    [
        (0, 2, ("gloo", "cpu")),
        (1, 1, ("nccl", "cuda")),
        (1, 2, ("gloo", "cpu")),  # nccl would put rank 1 on a cuda:1 that does not exist
        (4, 8, ("gloo", "cpu")),
        (8, 8, ("nccl", "cuda")),
        (8, 3, ("nccl", "cuda")),
    ],
)
def test_auto_takes_nccl_only_where_every_local_rank_has_a_gpu(
    torch_sees_gpus, monkeypatch, capsys, count, local_ranks, expected
):
    torch_sees_gpus(count)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert worker_backend() == expected
    said = capsys.readouterr().err
    if 0 < count < local_ranks:
        assert f"{local_ranks} local ranks but {count} GPU(s) visible" in said and "gloo" in said
    else:
        assert said == ""


def test_only_local_rank_0_says_why(torch_sees_gpus, monkeypatch, capsys):
    torch_sees_gpus(1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert worker_backend() == ("gloo", "cpu")
    assert capsys.readouterr().err == ""


def test_the_launchers_choice_stands(torch_sees_gpus, monkeypatch):
    torch_sees_gpus(1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("DDP_BACKEND", "gloo")
    assert worker_backend() == ("gloo", "cpu")
    torch_sees_gpus(0)
    monkeypatch.setenv("DDP_BACKEND", "nccl")
    with pytest.raises(ValueError, match="needs CUDA GPUs"):
        worker_backend()
