"""Complete, atomic checkpoints and exact resume: rank 0 writes a temporary file, fsyncs it and
`os.replace`s it into place (a crash leaves the previous checkpoint whole); loads use weights_only=True,
which is why RNG states are stored as tensors and ints, never NumPy arrays."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-step(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file could not be read; the message names the file."""


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / f"ckpt-step{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in `directory`, oldest first (temporary files are never listed)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def no_space_left(error: BaseException | None) -> bool:
    """Whether `error`, or an exception it came from, is a full disk (ENOSPC)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        error = error.__cause__ or error.__context__
    return False


def save_checkpoint(
    state: dict[str, Any], directory: str | os.PathLike[str], step: int, keep: int = 3
) -> Path:
    """Write `state` atomically as ``ckpt-step<step>.pt``, then prune to the newest `keep`."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    tmp = folder / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except (OSError, RuntimeError) as error:
        if no_space_left(error):  # torch.save says only "[enforce fail ...] unexpected pos"
            raise CheckpointError(
                f"no space left on the device that holds {folder} ({shutil.disk_usage(folder).free} bytes "
                f"free) while writing checkpoint step {step}; the earlier checkpoints are untouched"
            ) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(folder, os.O_RDONLY)  # the rename itself must reach the disk, or a power cut could undo it
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    for leftover in folder.iterdir():  # saves that never finished (a writer killed mid-save), up to `step`
        match = _TEMPORARY.match(leftover.name)
        if match and int(match[1]) <= step and not _running(int(match[2])):
            leftover.unlink(missing_ok=True)
    return final


_TEMPORARY = re.compile(r"^\.ckpt-step(\d+)\.pt\.(\d+)\.tmp$")


def _running(pid: int) -> bool:
    # a writer still running is another rank saving at once: it must fail on its own, not lose its file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Load one checkpoint with ``weights_only=True``. Raises `CheckpointError` naming the file."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated zip, wrong format, a pickled object weights_only refuses
        raise CheckpointError(f"cannot load checkpoint {path}: {type(err).__name__}: {err}") from err


def load_latest(
    directory: str | os.PathLike[str], map_location: Any = "cpu"
) -> tuple[dict[str, Any] | None, Path | None]:
    """The newest checkpoint that loads, falling back past corrupt ones. (None, None) if none."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return load_checkpoint(path, map_location), path
        except CheckpointError as err:
            log.warning("%s; falling back to the previous checkpoint", err)
    return None, None


def load_latest_on_every_rank(
    directory: str | os.PathLike[str], map_location: Any = "cpu"
) -> tuple[dict[str, Any] | None, Path | None]:
    """`load_latest` for a DDP job: rank 0 chooses, every rank loads the same file."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return load_latest(directory, map_location)
    choice: list[str | None] = [None]
    if dist.get_rank() == 0:
        state, path = load_latest(directory, map_location)
        choice[0] = None if path is None else str(path)
    dist.broadcast_object_list(choice, src=0)  # rank 0's choice reaches every rank
    dist.barrier()  # torch 2.7, gloo: a destroy right after the broadcast can hang (docs/torch-versions.md)
    if choice[0] is None:
        return None, None
    if dist.get_rank() == 0:
        return state, Path(choice[0])
    return load_checkpoint(choice[0], map_location), Path(choice[0])


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (where present) CUDA generator states, as weights_only-safe values."""
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # the global generator is an MT19937: its legacy state is a tuple
    state = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]  # torch.load gives lists back where getstate() had tuples
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    key = numpy["key"].cpu().numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
