"""ddp_helpers.chapters.ch04_checkpointing.checkpoint: atomic saves, rotation, safe loading with fallback, RNG round trip."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ddp_helpers.chapters.ch04_checkpointing import checkpoint as ckpt
from ddp_helpers.rank.data import ResumableDistributedSampler
from ddp_helpers.workers import worker_path


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}, "step": int(value), "config": {"lr": 0.1, "name": None}}


def test_save_keeps_only_the_newest_k_and_no_temporary_files(tmp_path):
    for step in range(1, 6):
        ckpt.save_checkpoint(state(step), tmp_path, step, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        "ckpt-step00000004.pt",
        "ckpt-step00000005.pt",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-step00000004.pt", "ckpt-step00000005.pt"]


def test_a_crash_during_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    ckpt.save_checkpoint(state(1), tmp_path, 1)

    def crash_half_way(obj, fh):
        fh.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(state(2), tmp_path, 2)
    monkeypatch.undo()
    loaded, path = ckpt.load_latest(tmp_path)
    assert loaded is not None and path is not None
    assert path.name == "ckpt-step00000001.pt" and loaded["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-step00000001.pt"]  # the temporary file is gone


def test_a_truncated_newest_checkpoint_is_named_and_skipped(tmp_path, caplog):
    ckpt.save_checkpoint(state(1), tmp_path, 1)
    newest = ckpt.save_checkpoint(state(2), tmp_path, 2)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(ckpt.CheckpointError, match=newest.name):
        ckpt.load_checkpoint(newest)
    with caplog.at_level("WARNING", logger="ddp_helpers.chapters.ch04_checkpointing.checkpoint"):
        loaded, path = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded["step"] == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert newest.name in caplog.text and "falling back to the previous checkpoint" in caplog.text


class Payload:
    """Stands for any object whose unpickling could run code."""


def test_loading_refuses_arbitrary_pickled_objects(tmp_path):
    path = tmp_path / "ckpt-step00000001.pt"
    torch.save({"payload": Payload()}, path)  # weights_only refuses classes it was not told to trust
    with pytest.raises(ckpt.CheckpointError, match="ckpt-step00000001.pt"):
        ckpt.load_checkpoint(path)


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path):
    assert ckpt.load_latest(tmp_path / "nowhere") == (None, None)
    with pytest.raises(ValueError):
        ckpt.save_checkpoint(state(1), tmp_path, 1, keep=0)


def test_rng_states_survive_a_save_and_load(tmp_path):
    ckpt.save_checkpoint({"rng": ckpt.capture_rng()}, tmp_path, 1)
    expected = (random.random(), np.random.rand(), torch.rand(3).tolist())
    loaded, _ = ckpt.load_latest(tmp_path)
    assert loaded is not None
    ckpt.restore_rng(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(3).tolist()) == expected


def test_resumable_sampler_continues_with_the_very_next_index():
    sampler = ResumableDistributedSampler(range(40), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2)
    sampler.start_at(7)
    assert len(sampler) == len(full) - 7
    assert list(sampler) == full[7:]
    assert list(sampler) == full  # the skip applies to one epoch only
    with pytest.raises(ValueError):
        sampler.start_at(len(full) + 1)


SAVER = """
import sys, torch
from ddp_helpers.chapters.ch04_checkpointing.checkpoint import save_checkpoint
folder = sys.argv[1]
save_checkpoint({"step": 1, "w": torch.zeros(4)}, folder, 1)
print("first saved", flush=True)
big = torch.randn(16 * 2**20)  # 64 MiB: each save takes long enough to be caught half-way
for step in range(2, 10_000):
    save_checkpoint({"step": step, "w": big}, folder, step, keep=2)
"""


def test_sigkill_during_a_save_leaves_a_loadable_checkpoint(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "first saved"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        partial = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and p.stat().st_size > 0]
        if partial:
            break
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)  # mid-write: a temporary file holds part of a checkpoint
    child.wait(timeout=30)
    assert partial, "never caught the saver half-way through a write"
    loaded, path = ckpt.load_latest(tmp_path)
    assert (
        loaded is not None
        and path is not None
        and loaded["step"] == int(path.name.removeprefix("ckpt-step").removesuffix(".pt"))
    )
    assert all(not p.name.endswith(".tmp") for p in ckpt.list_checkpoints(tmp_path))


def test_a_save_killed_mid_write_leaves_no_torn_file_under_a_final_name(tmp_path):
    """notebook 04's crash: the kernel kills the saver at a chosen byte (RLIMIT_FSIZE, SIGXFSZ), no cleanup."""
    worker = worker_path("checkpoint_faults")
    crash_at_byte = 100_000
    ended = subprocess.run(
        [
            sys.executable,
            str(worker),
            "crash",
            "--folder",
            str(tmp_path),
            "--crash-at-byte",
            str(crash_at_byte),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.returncode == -signal.SIGXFSZ, (ended.returncode, ended.stderr[-2000:])
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    torn = [name for name, size in sizes.items() if size == crash_at_byte]
    assert len(torn) == 1 and torn[0].endswith(".tmp"), sizes  # cut mid-write, under a temporary name
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["ckpt-step00000001.pt"]
    loaded, path = ckpt.load_latest(tmp_path)
    assert loaded is not None and path is not None
    assert loaded["step"] == 1 and sizes[path.name] > crash_at_byte  # whole, and no fallback was needed
    # the resumed run saves step 2 again: the killed save's temporary file goes with it
    ckpt.save_checkpoint(state(2), tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-step00000001.pt", "ckpt-step00000002.pt"]


def test_a_save_removes_temporaries_of_its_step_and_earlier_only(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid names a writer that is gone
    dead = child.pid
    for name in (f".ckpt-step00000001.pt.{dead}.tmp", f".ckpt-step00000003.pt.{dead}.tmp", "notes.tmp"):
        (tmp_path / name).write_bytes(b"torn")
    ckpt.save_checkpoint(state(2), tmp_path, 2)
    # a later step's temporary stays (nothing says its save is over), and files not named as ours stay
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".ckpt-step00000003.pt.{dead}.tmp",
        "ckpt-step00000002.pt",
        "notes.tmp",
    ]


def test_a_save_leaves_the_temporary_of_a_writer_still_running(tmp_path):
    """Every rank saving at once (notebook 04's mutant): rank 0 must not delete rank 1's file mid-write."""
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        in_flight = tmp_path / f".ckpt-step00000002.pt.{writer.pid}.tmp"
        in_flight.write_bytes(b"half")
        ckpt.save_checkpoint(state(2), tmp_path, 2)
        assert in_flight.exists()
    finally:
        writer.kill()
        writer.wait()
    ckpt.save_checkpoint(state(3), tmp_path, 3)  # its writer gone, the next save clears it
    assert not in_flight.exists()


AGREE_SCRIPT = """
import json, os, sys
import torch.distributed as dist
from ddp_helpers.chapters.ch04_checkpointing import checkpoint as ckpt
from ddp_helpers.rank import teardown

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.path.join(sys.argv[1], f"rank{rank}")  # each rank's own view of the checkpoint folder
own = ckpt.load_latest(folder)[0]
agreed, path = ckpt.load_latest_on_every_rank(folder)
with open(os.path.join(sys.argv[1], f"result{rank}.json"), "w") as fh:
    json.dump({"own": own["step"], "agreed": agreed["step"], "path": str(path)}, fh)
teardown.destroy_process_group()  # as every worker ends: dist's own can hang on torch 2.7 with gloo
"""


def test_every_rank_resumes_from_the_checkpoint_rank_0_chose(tmp_path):
    from ddp_helpers import launch

    # rank 1 sees a newer file than rank 0 (written between the two listings, or shown late by a
    # shared filesystem): each choosing for itself, the ranks would resume from different steps
    for rank, steps in ((0, [1, 2]), (1, [1, 2, 3])):
        for step in steps:
            ckpt.save_checkpoint(state(step), tmp_path / f"rank{rank}", step, keep=5)
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT)
    launch(
        script,
        tmp_path,
        nproc=2,
        backend="gloo",
        run_dir=tmp_path / "run",
        show_ranks="none",
        progress="off",
        timeout=120,
    )
    results = [json.loads((tmp_path / f"result{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["own"] for r in results] == [2, 3]  # the problem: two ranks, two steps
    assert [r["agreed"] for r in results] == [2, 2]  # rank 0's choice, on every rank
    assert results[0]["path"] == results[1]["path"]
