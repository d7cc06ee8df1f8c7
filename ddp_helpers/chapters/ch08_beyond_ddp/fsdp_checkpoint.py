"""fsdp.py's --part save and --part resume: distributed checkpoints (DCP) of a sharded model, and a DDP checkpoint
loaded into one."""

import argparse
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh

try:  # torch >= 2.6 exports FSDP2 here; 2.4-2.5 kept it private
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover
    from torch.distributed._composable.fsdp import fully_shard

from ddp_helpers.chapters.ch08_beyond_ddp.fsdp_model import checked_fsdp, gathered, local_shard, train_steps
from ddp_helpers.workers.train import build_model


def shard_shapes(model: nn.Module) -> dict:
    return {name: list(local_shard(p).shape) for name, p in model.named_parameters()}


def compare_with_full(model: nn.Module, full: dict) -> dict:
    """This rank's shard of each parameter against its rows of the saved full tensor (dealt as torch.chunk)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    max_diff, elements = 0.0, 0
    for name, param in model.named_parameters():
        chunks = full[name].chunk(world_size)
        rows = chunks[rank] if rank < len(chunks) else full[name][:0]
        mine = local_shard(param).detach().cpu()
        if mine.shape != rows.shape:
            return {"max_diff": float("inf"), "elements": elements, "mismatch": name}
        max_diff = max(max_diff, (mine - rows).abs().max().item() if rows.numel() else 0.0)
        elements += rows.numel()
    return {"max_diff": max_diff, "elements": elements}


class AppState:
    """Model and optimizer as DCP's `Stateful`, as the DCP tutorial writes it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        # get_state_dict: model and optimizer state keyed by parameter *name*, as DTensors (each rank its shard)
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


def part_save(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    half = args.steps // 2
    before = train_steps(model, optimizer, args, device, range(half))
    state = {"app": AppState(model, optimizer), "step": half}
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=args.checkpoint_dir)  # every rank writes its shards, rank 0 the metadata
    save_s = time.perf_counter() - start
    # the whole model, gathered to rank 0 as plain tensors, to check dcp_to_torch_save in the notebook
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(full, Path(args.run_dir) / "full_model.pt")
    after, timings = async_saves(model, optimizer, args, device, range(half, args.steps))
    return {
        "gradient_factor": factor,
        "saved_at_step": half,
        "losses": before + after,
        "shard_shapes": gathered(shard_shapes(model)),
        "save_s": save_s,
        **timings,
        "files": sorted(p.name for p in Path(args.checkpoint_dir).iterdir()),
    }


def async_saves(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    args: argparse.Namespace,
    device: torch.device,
    steps: range,
) -> tuple[list[float], dict]:
    """Train `steps`, each begun with an async_save of its starting state, one save in flight at a time."""
    # async_save writes from a background thread whose collectives (plan, metadata) must not interleave
    # with the training's on one group: it gets a group of its own
    checkpoint_group = dist.new_group(backend="gloo")
    assert isinstance(checkpoint_group, dist.ProcessGroup)  # every rank is in it
    pending: Future | None = None
    losses, returned_s = [], []
    for step in steps:
        if pending is not None:  # one save in flight (DCP's tutorial): a second holds a 2nd CPU copy
            pending.result()
        start = time.perf_counter()
        saving = dcp.async_save(
            {"app": AppState(model, optimizer), "step": step},
            checkpoint_id=f"{args.checkpoint_dir}-async/step{step}",
            process_group=checkpoint_group,
        )
        returned_s.append(time.perf_counter() - start)
        assert isinstance(saving, Future)  # (an AsyncSaveResponse comes back only with an async stager)
        pending = saving
        losses += train_steps(model, optimizer, args, device, range(step, step + 1))  # during the write
    if pending is not None:
        pending.result()
    return losses, {"async_steps": list(steps), "async_return_s": returned_s}


def part_resume(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    # dcp.load asks AppState for the shapes to load into, reads, and gives the values back to it
    state: dict[str, Any] = {"app": AppState(model, optimizer), "step": 0}
    dcp.load(state, checkpoint_id=args.checkpoint_dir)  # each rank reads the bytes of *its* shards
    result = {"gradient_factor": factor, "resumed_at_step": state["step"]}
    if args.saved_full:  # what each rank now holds, against the saving job's gathered full model
        full = torch.load(args.saved_full, map_location="cpu", weights_only=True)
        result["loaded_vs_saved"] = gathered(compare_with_full(model, full))
    result["losses"] = train_steps(model, optimizer, args, device, range(state["step"], args.steps))
    result["shard_shapes"] = gathered(shard_shapes(model))
    if args.ddp_checkpoint:
        result["ddp_checkpoint"] = load_ddp_checkpoint(args, mesh, device)
    return result


def load_ddp_checkpoint(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> dict:
    """A DDP job's checkpoint (train.py: rank 0 saved the plain model's full state_dict) into FSDP2."""
    rank = dist.get_rank()
    plain = (
        torch.load(args.ddp_checkpoint, map_location="cpu", weights_only=True)["model"] if rank == 0 else {}
    )
    shapes = [{name: list(t.shape) for name, t in plain.items()}]
    dist.broadcast_object_list(shapes, src=0)  # the model's sizes, for the ranks that did not read
    hidden, features = shapes[0]["1.weight"]
    classes = shapes[0]["7.weight"][0]
    model = build_model("mlp", (1, 1, features), classes, hidden).to(device)  # train.py's --model mlp
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # full_state_dict=True: the input is whole tensors; broadcast_from_rank0=True: only rank 0's dict
    # is read, and each rank keeps only its shard of each tensor (a copy of the dict:
    # set_model_state_dict may turn its values into DTensors in place)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(plain), options=options)
    back: dict[str, Any] = get_model_state_dict(  # whole tensors, on the CPU
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    x = torch.randn(args.global_batch, features, generator=torch.Generator().manual_seed(args.seed))
    sharded_out = model(x.to(device)).detach().cpu()
    row: dict[str, Any] = {
        "keys": sorted(shapes[0]),
        "shard_shapes": gathered(shard_shapes(model)),
        "tensors_read_per_rank": gathered(len(plain)),  # what each rank loaded from the file
    }
    if rank == 0:
        unsharded = build_model("mlp", (1, 1, features), classes, hidden)
        unsharded.load_state_dict(plain)
        row["max_weight_diff"] = max((back[k].cpu() - plain[k]).abs().max().item() for k in plain)
        row["max_output_diff"] = (sharded_out - unsharded(x).detach()).abs().max().item()
        assert row["max_weight_diff"] == 0.0, f"the DDP checkpoint did not load exactly: {row}"
        assert row["max_output_diff"] < 1e-5, f"the sharded model computes something else: {row}"
    return row
