"""A job that survives nodes coming and going: every step all-reduces, rank 0 records and saves the step.

Run under torchrun --nnodes MIN:MAX --max-restarts N; each (re)start scales the lr to its world's global batch.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from ddp_helpers.rank import teardown

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True, help="steps to reach, over every restart")
p.add_argument("--checkpoint-dir", required=True, help="on a filesystem every node sees")
p.add_argument("--step-s", type=float, default=0.2, help="seconds per step: time for nodes to come and go")
p.add_argument("--batch-per-rank", type=int, default=8, help="samples each rank takes per step")
p.add_argument("--base-lr", type=float, default=0.1, help="learning rate for a global batch of --base-batch")
p.add_argument("--base-batch", type=int, default=256, help="the global batch --base-lr was tuned for")
# a demo's stand-in for a long job: wait at this step until the world has grown, whatever the load
p.add_argument("--hold-at-step", type=int, default=None, help="wait here while the world is smaller than...")
p.add_argument("--hold-until-world", type=int, default=None, help="...this many ranks (torchrun restarts us)")
p.add_argument("--hold-max-s", type=float, default=300, help="give up waiting after this long")
args = p.parse_args()

dist.init_process_group("gloo")  # CPU tensors: runs on any machine; the lesson is membership
rank, world = dist.get_rank(), dist.get_world_size()
state_file = os.path.join(args.checkpoint_dir, "state.json")

# rank 0 reads the last saved step (and the samples seen by then) and every rank starts from it
saved = {"step": 0, "samples": 0}
if rank == 0 and os.path.exists(state_file):
    with open(state_file) as f:
        saved = json.load(f)
progress = torch.tensor([saved["step"], saved["samples"]])
dist.broadcast(progress, src=0)
step, samples = (int(v) for v in progress)

# every rank adds its own batch: the sum is the global batch that each step's gradient averages over,
# so a world that shrinks or grows changes it, and the learning rate follows (the linear scaling rule)
batch = torch.tensor([args.batch_per_rank])
dist.all_reduce(batch)
global_batch = int(batch.item())
lr = args.base_lr * global_batch / args.base_batch
if rank == 0:
    print(
        f"start: world {world}, step {step}, restart {os.environ['TORCHELASTIC_RESTART_COUNT']}, "
        f"global batch {global_batch}, lr {lr:g}",
        flush=True,
    )

while step < args.steps:
    if step == args.hold_at_step and world < args.hold_until_world:
        if rank == 0:
            print(
                f"holding at step {step}: world {world}, waiting for {args.hold_until_world} ranks",
                flush=True,
            )
        # torchrun stops us when another node arrives and starts us again in the larger world
        time.sleep(args.hold_max_s)
        raise TimeoutError(f"no node joined within {args.hold_max_s:g} s")
    ones = torch.ones(1)
    dist.all_reduce(ones)  # every rank adds 1: the sum is the world that took this step
    if int(ones.item()) != world:
        raise RuntimeError(f"all_reduce summed {ones.item()} over a world of {world}")
    step += 1
    samples += global_batch  # every rank's batch, not rank 0's alone
    if rank == 0:
        # written whole, then renamed: a node killed mid-write leaves the previous step, never half a file
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        # the step's record, before the save: a printed line dies in the agent's log tail when its node is
        # killed, this file does not (a step recorded but not saved is taken again, and recorded again)
        with open(os.path.join(args.checkpoint_dir, "steps.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "world": world, "samples": samples}) + "\n")
        with open(state_file + ".tmp", "w") as f:
            json.dump({"step": step, "samples": samples, "world": world}, f)
        os.replace(state_file + ".tmp", state_file)
        print(f"step {step}: world {world}, samples {samples}", flush=True)
    time.sleep(args.step_s)

if rank == 0:
    print(f"done: step {step}, world {world}, samples {samples}", flush=True)
dist.barrier()
teardown.destroy_process_group()  # dist.destroy_process_group(), minus gloo's hangs at exit
