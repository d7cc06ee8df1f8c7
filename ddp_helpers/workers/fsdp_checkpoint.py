"""fsdp.py's --part save and --part resume: distributed checkpoints (DCP) of a sharded model.

`part_save` writes on N ranks, synchronously and in the background; `part_resume` loads on M ranks (DCP
reshards); `load_ddp_checkpoint` loads a plain DDP job's checkpoint (train.py's) into a sharded model.
The model, its check against one process and the training steps are fsdp.py's.
"""

import time
from pathlib import Path

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

try:  # torch >= 2.6 exports FSDP2 here; 2.4-2.5 kept it private
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover
    from torch.distributed._composable.fsdp import fully_shard

from ddp_helpers.workers.fsdp import checked_fsdp, train_steps
from ddp_helpers.workers.fsdp_measures import gathered


def shard_shapes(model: nn.Module) -> dict:
    return {name: list(p.to_local().shape) for name, p in model.named_parameters()}


def part_save(args, mesh, device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    half = args.steps // 2
    before = train_steps(model, optimizer, args, device, range(half))
    # get_state_dict: model and optimizer state keyed by parameter *name*, as DTensors (each rank its shard)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": half}
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=args.checkpoint_dir)  # every rank writes its shards, rank 0 the metadata
    save_s = time.perf_counter() - start
    # the whole model, gathered to rank 0 as plain tensors, to check dcp_to_torch_save in the notebook
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(full, Path(args.run_dir) / "full_model.pt")
    # async_save: copy to CPU now, write in a background thread while training goes on. That thread
    # runs collectives of its own (gathering the plan and metadata): on the training's group they would
    # interleave with the training's and gloo would abort ("collective mismatch"). It gets its own group.
    checkpoint_group = dist.new_group(backend="gloo")
    start = time.perf_counter()
    future = dcp.async_save(
        state, checkpoint_id=args.checkpoint_dir + "-async", process_group=checkpoint_group
    )
    async_return_s = time.perf_counter() - start
    after = train_steps(model, optimizer, args, device, range(half, args.steps))  # runs during the write
    start = time.perf_counter()
    future.result()
    async_wait_s = time.perf_counter() - start
    return {
        "gradient_factor": factor,
        "saved_at_step": half,
        "losses": before + after,
        "shard_shapes": gathered(shard_shapes(model)),
        "save_s": save_s,
        "async_return_s": async_return_s,
        "async_wait_s": async_wait_s,
        "files": sorted(p.name for p in Path(args.checkpoint_dir).iterdir()),
    }


def part_resume(args, mesh, device) -> dict:
    model, factor = checked_fsdp(args, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.adam_lr)
    model_state, optim_state = get_state_dict(model, optimizer)  # the shapes to load into
    state = {"model": model_state, "optim": optim_state, "step": 0}
    dcp.load(state, checkpoint_id=args.checkpoint_dir)  # each rank reads the bytes of *its* shards
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses = train_steps(model, optimizer, args, device, range(state["step"], args.steps))
    result = {"gradient_factor": factor, "resumed_at_step": state["step"], "losses": losses}
    result["shard_shapes"] = gathered(shard_shapes(model))
    if args.ddp_checkpoint:
        result["ddp_checkpoint"] = load_ddp_checkpoint(args, mesh, device)
    return result


def train_py_mlp(features: int, hidden: int, classes: int) -> nn.Sequential:
    """train.py's --model mlp, layer for layer, so that its state_dict keys (1.weight, ...) match."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(0.0),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(0.0),
        nn.Linear(hidden, classes),
    )


def load_ddp_checkpoint(args, mesh, device) -> dict:
    """A DDP job's checkpoint (train.py: rank 0 saved the plain model's full state_dict) into FSDP2."""
    plain = torch.load(args.ddp_checkpoint, map_location="cpu", weights_only=True)["model"]
    hidden, features = plain["1.weight"].shape
    classes = plain["7.weight"].shape[0]
    model = train_py_mlp(features, hidden, classes).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # full_state_dict=True: the input is whole tensors; each rank keeps only its shard of each
    # (a copy: set_model_state_dict turns the dict's values into DTensors in place)
    set_model_state_dict(model, dict(plain), options=StateDictOptions(full_state_dict=True))
    back = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    x = torch.randn(args.global_batch, features, generator=torch.Generator().manual_seed(args.seed))
    sharded_out = model(x.to(device)).detach().cpu()
    unsharded = train_py_mlp(features, hidden, classes)
    unsharded.load_state_dict(plain)
    row = {"keys": sorted(plain), "shard_shapes": gathered(shard_shapes(model))}
    if dist.get_rank() == 0:
        row["max_weight_diff"] = max((back[k].cpu() - plain[k]).abs().max().item() for k in plain)
        row["max_output_diff"] = (sharded_out - unsharded(x).detach()).abs().max().item()
        assert row["max_weight_diff"] == 0.0, f"the DDP checkpoint did not load exactly: {row}"
        assert row["max_output_diff"] < 1e-5, f"the sharded model computes something else: {row}"
    return row
