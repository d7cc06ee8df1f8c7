"""The probe: runs the learner's script as __main__ on each rank and records what it did (torch and stdlib only)."""

PROBE = r'''"""Written by ddp_helpers.chapters.ch10_capstone.ch10_exercises: runs a script as __main__ on this rank and records
what it does (samples, dropout masks and random state, each iter(loader)'s seed, weights after each step,
loss scale, saves).
The dropout masks are drawn here, as dropout draws them, so that the check can replay the training."""
import hashlib, json, os, runpy, sys

import torch
import torch.nn.functional as F
from torch.amp.grad_scaler import GradScaler
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

RANK = int(os.environ.get("RANK", "0"))
_x = torch.load(os.environ["CAPSTONE_PROBE_DATA"], weights_only=True)["x"]
ROWS = {tuple(row): i for i, row in enumerate(_x.tolist())}
FEATURES = _x.shape[1]
record = {"forwards": [], "steps": [], "scales": [], "saves": [], "replaces": [], "ddp": 0, "loaders": [],
          "loads": [], "rng_exit": None, "device": None, "scalers": [], "events": [], "seeds": [],
          "scaler_steps": 0, "iters": []}


def digest():
    """Each generator's state, by name: the CPU's, and the current GPU's where CUDA is in use (dropout on a
    GPU draws from the GPU's generator), so that the check can say which one a resume did not restore."""
    states = {"cpu": hashlib.sha1(bytes(torch.get_rng_state().tolist())).hexdigest()[:12]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = hashlib.sha1(bytes(torch.cuda.get_rng_state().tolist())).hexdigest()[:12]
    return states


def where(f):
    """The file a path or an open file names; None for a buffer in memory (collectives pickle into one).
    A file opened on a descriptor (os.fdopen(fd), as after tempfile.mkstemp) is named by its descriptor."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(f))
    name = getattr(f, "name", None)
    if isinstance(name, int) and not isinstance(name, bool):
        return opened_at(name)
    return os.path.abspath(os.fsdecode(name)) if isinstance(name, (str, bytes)) else None


_opened = {}  # descriptor -> (the path os.open opened it at, its device, its inode)
_os_open = os.open
def os_open(path, flags, mode=0o777, *, dir_fd=None):
    """os.open, which tempfile.mkstemp calls too, remembering where each descriptor was opened."""
    fd = _os_open(path, flags, mode, dir_fd=dir_fd)
    if dir_fd is None:
        stat = os.fstat(fd)
        _opened[fd] = (os.path.abspath(os.fsdecode(path)), stat.st_dev, stat.st_ino)
    return fd
os.open = os_open


def opened_at(fd):
    """The path an open descriptor's file was opened at (while the descriptor is still that file), or
    where /proc links it; None for a pipe, a socket or a closed descriptor."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    path, device, inode = _opened.get(fd, (None, None, None))
    if path is not None and (device, inode) == (stat.st_dev, stat.st_ino):
        return path
    try:
        link = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return None
    return link if os.path.isabs(link) else None


def autocast(input):
    """The dtype autocast gives this device's matmuls here ("torch.float16"), or "off"."""
    kind = input.device.type
    if not torch.is_autocast_enabled(kind):
        return "off"
    return str(torch.get_autocast_dtype(kind))


_linear = torch.nn.Linear.forward
def linear(self, input):
    if self.in_features == FEATURES and self.training:
        rows = input.detach().float().cpu().tolist()
        record["forwards"].append({"batch": [ROWS.get(tuple(r), -1) for r in rows], "autocast": autocast(input)})
        record["device"] = input.device.type
    return _linear(self, input)
torch.nn.Linear.forward = linear

_dropout = F.dropout
def dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0:
        return _dropout(input, p, training, inplace)
    if not record["forwards"] or "mask" in record["forwards"][-1]:
        record["forwards"].append({"batch": []})
    entry = record["forwards"][-1]
    entry["rng"] = digest()
    record["events"].append("mask")
    keep = torch.empty(input.shape, device=input.device).bernoulli_(1 - p)
    entry["shape"] = list(input.shape)
    entry["mask"] = "".join("1" if k else "0" for k in keep.flatten().bool().tolist())
    return input * (keep.to(input.dtype) / (1 - p))
F.dropout = dropout

def after_step(optimizer, args, kwargs):
    flat = [p.detach().float().flatten().cpu() for g in optimizer.param_groups for p in g["params"]]
    record["steps"].append({"at": len(record["forwards"]), "weights": torch.cat(flat).tolist()})
    record["events"].append("step")
register_optimizer_step_post_hook(after_step)


def spy(owner, name, note, after=False):
    """Replace owner.name by the same call that also calls note(*args, **kwargs), before it or after."""
    original = getattr(owner, name)
    def spied(*args, **kwargs):
        if not after:
            note(*args, **kwargs)
        result = original(*args, **kwargs)
        if after:
            note(*args, **kwargs)
        return result
    setattr(owner, name, spied)
    return spied


def event(name):
    return lambda *args, **kwargs: record["events"].append(name)
def count(key):
    def note(*args, **kwargs):
        record[key] += 1
    return note


def scaler_made(self, *args, **kwargs):
    record["scalers"].append({"enabled": bool(self.is_enabled()), "device": str(getattr(self, "_device", ""))})
def scale_updated(self, *args, **kwargs):
    if self.is_enabled():
        record["scales"].append({"at": len(record["forwards"]), "scale": float(self.get_scale())})
def saved(obj, f, *args, **kwargs):
    if where(f) is not None:
        record["saves"].append(where(f))
        record["events"].append("save")
def loaded(f, *args, **kwargs):
    if where(f) is not None:
        record["loads"].append(where(f))
def replaced(src, dst, *args, **kwargs):
    record["replaces"].append([where(src), where(dst)])
    record["events"].append("replace")
def seeded(seed):
    record["seeds"].append(int(seed))
    record["events"].append("manual_seed")

spy(GradScaler, "__init__", scaler_made, after=True)
spy(GradScaler, "step", count("scaler_steps"))
spy(GradScaler, "update", scale_updated, after=True)
spy(torch, "save", saved)
spy(torch, "load", loaded)
_os_replace = os.replace
spy(os, "replace", replaced, after=True)
spy(os, "rename", replaced, after=True)
spy(DistributedDataParallel, "__init__", count("ddp"))
torch.random.manual_seed = spy(torch, "manual_seed", seeded)
torch.random.set_rng_state = spy(torch, "set_rng_state", event("set_rng_state"))
spy(DataLoader, "__init__", lambda self, *a, **k: record["loaders"].append(self.generator is not None), after=True)

_loader_iter = DataLoader.__iter__
def loader_iter(self):
    """Each iter(loader)'s draw from the loader's generator (or the global one): the base seed its workers,
    with num_workers > 0, would be seeded with (base seed + worker id)."""
    it = _loader_iter(self)
    record["iters"].append(getattr(it, "_base_seed", None))
    return it
DataLoader.__iter__ = loader_iter

import torch.distributed as dist
spy(dist, "barrier", event("barrier"))

_destroy = dist.destroy_process_group
def destroy_process_group(group=None):
    # Before torch 2.8, gloo's destroy can deadlock on the GIL (pytorch/pytorch#154976): torch's bug, not
    # the script's. A Python handle on gloo's backend, freed after the destroy, frees it without the GIL.
    if group is None:
        record["events"].append("destroy_process_group")
    keep = None
    if group is None and dist.is_initialized() and dist.get_backend() == "gloo":
        keep = dist.group.WORLD._get_backend(torch.device("cpu"))
    _destroy(group)
    del keep
dist.destroy_process_group = destroy_process_group

script = os.path.abspath(sys.argv[1])
sys.argv = [script] + sys.argv[2:]
sys.path[0] = os.path.dirname(script)
try:  # how the script ended is the launch's to report: torchrun's exit codes, the ranks' tracebacks
    runpy.run_path(script, run_name="__main__")
finally:
    record["rng_exit"] = digest()
    path = os.path.join(os.environ["CAPSTONE_PROBE_DIR"], "rank%d.json" % RANK)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    _os_replace(path + ".tmp", path)
'''
