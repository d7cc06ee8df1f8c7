"""single_device.py and ddp.py stand alone: copied where ddp_helpers cannot be imported, they run
under plain `python` and plain torchrun, and the DDP one picks gloo by itself on the CPU."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from ddp_helpers.workers import worker_path

# A sitecustomize that makes `import ddp_helpers` fail, as on a machine without this package
# (the editable install would otherwise find it from any folder)
BLOCK = """
import sys

class _NoDdpHelpers:
    def find_spec(self, name, path=None, target=None):
        if name == "ddp_helpers" or name.startswith("ddp_helpers."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _NoDdpHelpers())

# Registered first, so it runs last at exit: the threads still alive once the script is done. A gloo
# thread still running here races the interpreter's teardown (the SIGABRT in ddp.py's own comment).
import atexit, os

def _threads_at_exit():
    if "LOCAL_RANK" in os.environ:
        names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
        # one write() call: both ranks share torchrun's stderr, and print() writes its pieces one by one
        os.write(2, ("threads at exit: " + ",".join(names) + "\\n").encode())

if os.path.isdir("/proc/self/task"):
    atexit.register(_threads_at_exit)
"""


@pytest.fixture
def elsewhere(tmp_path):
    """A folder holding copies of both scripts, and an environment where ddp_helpers is absent."""
    for name in ("single_device.py", "ddp.py"):
        shutil.copy(worker_path(name), tmp_path / name)
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_", "RANK", "LOCAL_", "WORLD_"))}
    env["PYTHONPATH"] = str(tmp_path / "block")
    env["TMPDIR"] = str(tmp_path)  # plain torchrun makes a torchelastic_* folder there, and keeps it
    return tmp_path, env


def run(cmd: list[str], folder: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=240)


def accuracy(state_dict: dict, folder: Path) -> float:
    """The saved model's accuracy on the scripts' own dataset, built by the copied script."""
    sys.path.insert(0, str(folder))
    try:
        # the copy: its make_dataset is the one both scripts train on
        single_device = importlib.import_module("single_device")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("single_device", None)
    x, y = single_device.make_dataset().tensors
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    model.load_state_dict(state_dict)  # strict: a "module." prefix would fail here
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def test_the_copies_cannot_import_ddp_helpers(elsewhere):
    folder, env = elsewhere
    proc = run([sys.executable, "-c", "import ddp_helpers"], folder, env)
    assert proc.returncode != 0 and "No module named 'ddp_helpers'" in proc.stderr
    for name in ("single_device.py", "ddp.py"):
        assert "ddp_helpers" not in (folder / name).read_text().split('"""', 2)[2]  # code, not docstring


def test_single_device_trains_with_plain_python(elsewhere):
    folder, env = elsewhere
    proc = run([sys.executable, "single_device.py", "--epochs", "2", "--save", "one.pt"], folder, env)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == ["epoch 0", "epoch 1", "saved one.pt"]
    assert "(mean over 2048 samples)" in proc.stdout.splitlines()[0], proc.stdout  # the whole epoch
    assert accuracy(torch.load(folder / "one.pt"), folder) > 0.9


def test_ddp_trains_under_plain_torchrun_with_two_processes(elsewhere):
    folder, env = elsewhere
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "ddp.py",
        "--epochs",
        "2",
        "--save",
        "ddp.pt",
    ]
    proc = run(cmd, folder, env)
    assert proc.returncode == 0, proc.stderr
    if Path("/proc/self/task").is_dir():
        # destroy_process_group() ended gloo's threads on both ranks: none is left to race the exit
        at_exit = [line for line in proc.stderr.splitlines() if line.startswith("threads at exit:")]
        assert at_exit == ["threads at exit: python"] * 2, proc.stderr
    # every rank says where its shard starts, each epoch; rank 0 alone prints the loss and saves. The ranks
    # share one pipe, and python -u writes a print's text and its newline apart: read the words, not the lines
    out = proc.stdout
    assert sorted(re.findall(r"rank (\d) drew samples \[", out)) == ["0", "0", "1", "1"], out
    assert re.findall(r"epoch (\d): loss", out) == ["0", "1"] and out.count("saved ddp.pt") == 1, out
    # the loss is averaged over every rank's samples (all_reduce), not over rank 0's 1024 alone
    assert re.findall(r"epoch 0: loss [0-9.]+ \(mean over (\d+) samples\)", out) == ["2048"], out
    assert accuracy(torch.load(folder / "ddp.pt"), folder) > 0.9


def test_ddp_without_torchrun_says_what_is_missing(elsewhere):
    folder, env = elsewhere
    proc = run([sys.executable, "ddp.py"], folder, env)
    assert proc.returncode == 2
    assert "start it with torchrun" in proc.stderr


def test_both_scripts_train_in_a_function_of_the_same_name():
    """The notebook diffs single_device.py against ddp.py: their training lives in train(args, device)."""
    import ast

    for name in ("single_device.py", "ddp.py"):
        tree = ast.parse(worker_path(name).read_text())
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert {"make_dataset", "train", "main"} <= set(functions), (name, sorted(functions))
        assert [a.arg for a in functions["train"].args.args] == ["args", "device"], name


# Ends like the scripts a learner writes: collectives on temporaries, so a gloo thread may still be
# freeing one when the destroy starts. Without ddp.py's teardown() this hung 23 times in 40 on torch 2.7.1.
ENDS_ON_TEMPORARIES = """
import faulthandler, torch, torch.distributed as dist
from ddp import teardown

faulthandler.dump_traceback_later(30, exit=True)  # a hung rank prints where it waits, and leaves

dist.init_process_group("gloo")
for _ in range(200):
    dist.all_reduce(torch.ones(1000))
teardown()
print("torn down", flush=True)
"""


@pytest.mark.skipif(
    tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 8),
    reason="the deadlock is torch < 2.8's (pytorch/pytorch#154976): make test-compat runs this on 2.7.1",
)
def test_ddp_teardown_never_deadlocks_in_gloos_destroy(elsewhere):
    folder, env = elsewhere
    (folder / "ends.py").write_text(ENDS_ON_TEMPORARIES)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", "ends.py"]
    for attempt in range(6):  # about half the runs hung without teardown(): six all pass by chance 1 in 100
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        out, err = proc.stdout, proc.stderr
        assert "Timeout (0:00:30)!" not in err, f"run {attempt + 1} hung in the teardown: {err}"
        assert proc.returncode == 0, err
        assert out.count("torn down") == 3, out
