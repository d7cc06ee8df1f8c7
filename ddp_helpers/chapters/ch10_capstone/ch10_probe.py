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
record = {"rank": RANK, "forwards": [], "steps": [], "scales": [], "saves": [], "replaces": [], "ddp": 0,
          "loaders": [], "loads": [], "rng_exit": None, "error": None, "device": None, "scalers": [],
          "events": [], "seeds": [], "scaler_steps": 0, "iters": []}


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

_scaler_init = GradScaler.__init__
def scaler_init(self, *args, **kwargs):
    _scaler_init(self, *args, **kwargs)
    record["scalers"].append({"enabled": bool(self.is_enabled()), "device": str(getattr(self, "_device", ""))})
GradScaler.__init__ = scaler_init

_scaler_step = GradScaler.step
def scaler_step(self, optimizer, *args, **kwargs):
    record["scaler_steps"] += 1
    return _scaler_step(self, optimizer, *args, **kwargs)
GradScaler.step = scaler_step

_update = GradScaler.update
def update(self, new_scale=None):
    _update(self, new_scale)
    if self.is_enabled():
        record["scales"].append({"at": len(record["forwards"]), "scale": float(self.get_scale())})
GradScaler.update = update

_save = torch.save
def save(obj, f, *args, **kwargs):
    if where(f) is not None:
        record["saves"].append(where(f))
        record["events"].append("save")
    return _save(obj, f, *args, **kwargs)
torch.save = save

_load = torch.load
def load(f, *args, **kwargs):
    if where(f) is not None:
        record["loads"].append(where(f))
    return _load(f, *args, **kwargs)
torch.load = load

def renaming(original):
    def rename(src, dst, *args, **kwargs):
        result = original(src, dst, *args, **kwargs)
        record["replaces"].append([where(src), where(dst)])
        record["events"].append("replace")
        return result
    return rename
_os_replace = os.replace
os.replace, os.rename = renaming(os.replace), renaming(os.rename)

_ddp_init = DistributedDataParallel.__init__
def ddp_init(self, *args, **kwargs):
    record["ddp"] += 1
    return _ddp_init(self, *args, **kwargs)
DistributedDataParallel.__init__ = ddp_init

_manual_seed = torch.manual_seed
def manual_seed(seed):
    record["seeds"].append(int(seed))
    record["events"].append("manual_seed")
    return _manual_seed(seed)
torch.manual_seed = torch.random.manual_seed = manual_seed

_set_rng_state = torch.set_rng_state
def set_rng_state(new_state):
    record["events"].append("set_rng_state")
    return _set_rng_state(new_state)
torch.set_rng_state = torch.random.set_rng_state = set_rng_state

_loader_init = DataLoader.__init__
def loader_init(self, *args, **kwargs):
    _loader_init(self, *args, **kwargs)
    record["loaders"].append(self.generator is not None)
DataLoader.__init__ = loader_init

_loader_iter = DataLoader.__iter__
def loader_iter(self):
    """Each iter(loader)'s draw from the loader's generator (or the global one): the base seed its workers,
    with num_workers > 0, would be seeded with (base seed + worker id)."""
    it = _loader_iter(self)
    record["iters"].append(getattr(it, "_base_seed", None))
    return it
DataLoader.__iter__ = loader_iter

import torch.distributed as dist
_barrier = dist.barrier
def barrier(*args, **kwargs):
    record["events"].append("barrier")
    return _barrier(*args, **kwargs)
dist.barrier = barrier

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
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit:
    if exit.code not in (None, 0):
        record["error"] = "SystemExit: " + str(exit.code)
    raise
except BaseException as error:
    record["error"] = type(error).__name__ + ": " + str(error)
    raise
finally:
    record["rng_exit"] = digest()
    path = os.path.join(os.environ["CAPSTONE_PROBE_DIR"], "rank%d.json" % RANK)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    _os_replace(path + ".tmp", path)
'''
