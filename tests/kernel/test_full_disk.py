"""A full disk is named: a checkpoint written to it, and a run whose folder is on it. The earlier checkpoints
stay whole and no temporary file is left. The device is a 96 KiB tmpfs, mounted where this machine lets
the tests mount one (as root, with the capability); elsewhere these tests skip and say why."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import ddp_helpers
from ddp_helpers.chapters.ch04_checkpointing.checkpoint import (
    CheckpointError,
    list_checkpoints,
    no_space_left,
    save_checkpoint,
)
from ddp_helpers.kernel.launcher.resources import full_disk_note


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.decode().strip()}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_found_through_torchs_own_error():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as error:
        assert no_space_left(error)
    assert not no_space_left(RuntimeError("unexpected pos")) and not no_space_left(OSError(errno.EIO, "io"))


def test_a_checkpoint_on_a_full_disk_says_so_and_keeps_the_earlier_one(small_disk):
    folder = small_disk / "checkpoints"
    first = save_checkpoint({"w": torch.zeros(1000)}, folder, step=1)  # 4 KB: fits
    with pytest.raises(CheckpointError, match="no space left on the device that holds") as caught:
        save_checkpoint({"w": torch.zeros(100_000)}, folder, step=2)  # 400 KB: does not
    assert "earlier checkpoints are untouched" in str(caught.value)
    assert list_checkpoints(folder) == [first] and torch.load(first)["w"].shape == (1000,)
    assert [p.name for p in folder.iterdir()] == [first.name], "a temporary file was left behind"


def test_a_run_whose_folder_is_on_a_full_disk_says_so(small_disk, tmp_path):
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as fh:  # fill the device (unbuffered: nothing left to flush)
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    assert full_disk_note(small_disk).startswith(" The device that holds")
    script = tmp_path / "w.py"
    script.write_text("print('hello')\n")
    with pytest.raises(ddp_helpers.LaunchError) as caught:
        ddp_helpers.launch(script, nproc=2, run_dir=small_disk / "run", progress="off", timeout=60)
    assert "no space left on the device that holds" in str(caught.value), str(caught.value)
    leftovers = [p.name for p in Path(small_disk).rglob("*.tmp")]
    assert not leftovers, leftovers
    assert os.path.exists(filler)
