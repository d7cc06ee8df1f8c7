"""The lines a whole DDP training script needs (the capstone, notebook 10), each taught by an exercise.

Each exercise's `covers` names the lines it has the learner write; a test checks that the exercises
of notebooks 01-09 cover every one, and the capstone notebook shows each as code.
"""

from __future__ import annotations

LINES: dict[str, str] = {
    "backend": "init_process_group with nccl where there are GPUs, else gloo",
    "set-device": "torch.cuda.set_device(local_rank) on GPUs, before any CUDA work",
    "device-from-local-rank": "the device from LOCAL_RANK, never RANK",
    "rank-world": "rank and world size from the process group (or RANK / WORLD_SIZE)",
    "same-init-seed": "the same seed on every rank before the model is built",
    "sampler": "DistributedSampler(dataset): a shard per rank",
    "loader-sampler": "DataLoader(..., sampler=sampler), with no shuffle=True of its own",
    "loader-generator": "the loader's generator=, seeded, so that each iter() draws from it",
    "set-epoch": "sampler.set_epoch(epoch) at the start of each epoch",
    "ddp-wrap": "DDP(model, device_ids=[local_rank]) on GPUs, device_ids=None on the CPU",
    "optimizer-params": "the optimizer over the model's parameters (the same tensors inside DDP)",
    "autocast-bf16": "torch.autocast(device.type, dtype=torch.bfloat16) around the forward",
    "autocast-fp16": "torch.autocast(device.type, dtype=torch.float16) with a GradScaler",
    "scaler-scale": "scaler.scale(loss).backward()",
    "scaler-unscale": "scaler.unscale_(optimizer) before clipping",
    "clip": "clip_grad_norm_ on the unscaled gradients",
    "scaler-step": "scaler.step(optimizer): skipped on every rank when any gradient is inf",
    "scaler-update": "scaler.update() after each step",
    "zero-grad": "optimizer.zero_grad() each step",
    "loss-mean": "the logged loss averaged over ranks: all_reduce of the sum and the count",
    "rank0-logs": "rank 0 alone prints the log",
    "save-module": "the checkpoint holds model.module.state_dict(): plain keys",
    "save-optimizer": "the checkpoint holds optimizer.state_dict()",
    "save-scaler": "the checkpoint holds scaler.state_dict()",
    "save-position": "the checkpoint holds the epoch and the position in the epoch",
    "save-rng": "the checkpoint holds every rank's random state",
    "save-loader-generator": "the checkpoint holds the loader generator's state",
    "rank0-writes": "rank 0 alone writes the checkpoint",
    "atomic-write": "the checkpoint written to a temporary file, then os.replace'd into place",
    "barrier-after-save": "a barrier after the save, so that no rank runs ahead of a file being written",
    "load-map-location": "every rank loads with map_location set to its own device",
    "load-before-wrap": "the state loaded into the raw model before DDP(...) wraps it",
    "rank0-chooses": "rank 0 chooses the checkpoint to resume, and broadcasts its choice",
    "skip-done-batches": "the resumed epoch skips the batches already trained",
    "restore-rng": "each rank restores its own random state",
    "lr-scaled": "the learning rate scaled with the world size (the linear rule)",
    "nan-skip-all": "a step skipped on every rank when any rank's loss is not finite",
    "no-sync-accumulation": "gradient accumulation under no_sync(), with one all-reduce per step",
    "teardown": "every rank waits for the others when training returns (a barrier), and "
    "destroy_process_group() in a finally block",
}
