"""Prints what a fresh interpreter draws for itself: different on every rank (forked ranks shared them)."""

import json
import os
import subprocess
import sys

import torch

names = [f"layer{i}.weight" for i in range(32)]
child = subprocess.run(  # a rank's own child: it must not register for stack dumps as a rank does
    [sys.executable, "-c", "import os; print(os.environ.get('DDP_HELPERS_STACK_DUMPS'))"],
    capture_output=True,
    text=True,
    check=True,
).stdout.strip()
seen = {
    "rank": int(os.environ["RANK"]),
    "hash": hash("parameter.weight"),
    "set_order": list(set(names)),
    "initial_seed": torch.initial_seed(),
    "child_registers": child,
    "hidden_sitecustomize": os.environ.get("HIDDEN_SITECUSTOMIZE_RAN"),
}
print("SEEN " + json.dumps(seen), flush=True)
