"""What the exercises of notebook 06 share."""

from __future__ import annotations

from typing import Any

NODES = 2
GPUS_PER_NODE = 4
CPU_PER_NODE = 2


def pretend_env(rank: int, per_node: int) -> dict[str, str]:
    """What torchrun puts in a worker's environment on a job of NODES nodes x `per_node` processes."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % per_node),
        "WORLD_SIZE": str(NODES * per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(rank // per_node),
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
    }


def gpu_ranks(live_rank: int) -> list[int]:
    """The pretend GPU ranks a live rank probes: one on node 0 and one on node 1, as (r, r + 5) mod 8."""
    world = NODES * GPUS_PER_NODE
    return [live_rank % world, (live_rank + 5) % world]


def cpu_rank(live_rank: int) -> int:
    return (live_rank + 3) % (NODES * CPU_PER_NODE)


class _Recorder:
    """What the answer asked of the pretend machine during one call."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.events: list[str] = []
        self.backends: list[Any] = []
        self.set_device: list[Any] = []
        self.current_index = 0
        self.initialized = False
        self.env: dict[str, str] = {}  # the pretend process's environment, where its process group reads RANK


class _FakeCuda:
    """`torch.cuda` on the pretend node: its GPU count, and `set_device` recorded, not done."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def is_available(self) -> bool:
        return self._recorder.gpus > 0

    def device_count(self) -> int:
        return self._recorder.gpus

    def current_device(self) -> int:
        return self._recorder.current_index

    def set_device(self, device: Any) -> None:
        import torch

        index = device if isinstance(device, int) else torch.device(device).index
        self._recorder.set_device.append(index)
        if self._recorder.gpus == 0:
            raise RuntimeError("No CUDA GPUs are available")
        if index is None or not 0 <= index < self._recorder.gpus:
            raise RuntimeError("CUDA error: invalid device ordinal")  # as CUDA says it
        self._recorder.current_index = index

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)


class _FakeAccelerator:
    """`torch.accelerator` (torch 2.6 and later) on the pretend node, as `_FakeCuda`."""

    def __init__(self, cuda: _FakeCuda) -> None:
        self._cuda = cuda

    def is_available(self) -> bool:
        return self._cuda.is_available()

    def device_count(self) -> int:
        return self._cuda.device_count()

    def current_accelerator(self, check_available: bool = False) -> Any:
        import torch

        return torch.device("cuda") if self._cuda.is_available() else None

    def set_device_index(self, device: Any) -> None:
        self._cuda.set_device(device)

    set_device_idx = set_device_index

    def current_device_index(self) -> int:
        return self._cuda.current_device()


class _FakeTorch:
    """`torch`, but for `torch.cuda` and `torch.accelerator`, which are the pretend node's."""

    def __init__(self, recorder: Any) -> None:
        self.cuda = _FakeCuda(recorder)
        self.accelerator = _FakeAccelerator(self.cuda)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


class _FakeDist:
    """`torch.distributed`, but with the process group's start and end recorded instead of run."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def init_process_group(self, backend: Any = None, *args: Any, **kwargs: Any) -> None:
        self._recorder.backends.append(None if backend is None else str(backend))
        self._recorder.events.append("init_process_group")
        self._recorder.initialized = True

    def is_initialized(self) -> bool:
        return self._recorder.initialized

    # After init_process_group, the pretend group answers as torchrun's environment says (init_method env://
    # reads RANK and WORLD_SIZE): an answer may take its rank from dist.get_rank(), as most tutorials do.
    def _variable(self, name: str) -> int:
        if not self._recorder.initialized:
            raise ValueError(
                "Default process group has not been initialized, please make sure to call init_process_group."
            )
        return int(self._recorder.env[name])

    def get_rank(self, group: Any = None) -> int:
        return self._variable("RANK")

    def get_world_size(self, group: Any = None) -> int:
        return self._variable("WORLD_SIZE")

    def get_node_local_rank(self, fallback_rank: int | None = None) -> int:
        """torch 2.4 and later: LOCAL_RANK from the environment, as torch reads it (no group needed)."""
        if "LOCAL_RANK" in self._recorder.env:
            return int(self._recorder.env["LOCAL_RANK"])
        if fallback_rank is not None:
            return fallback_rank
        raise RuntimeError("LOCAL_RANK is not in the environment")

    def get_backend(self, group: Any = None) -> str:
        self._variable("RANK")
        return str(self._recorder.backends[-1])

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._recorder.events.append("barrier")

    def destroy_process_group(self, *args: Any, **kwargs: Any) -> None:
        self._recorder.events.append("destroy_process_group")
        self._recorder.initialized = False

    def __getattr__(self, name: str) -> Any:
        import torch.distributed as dist

        return getattr(dist, name)


def _stand_ins() -> dict[str, Any]:
    """The names whose stand-ins replace the real ones in the answer's namespace, and the recorder they
    share (observe points it at a fresh record before each call). rank, world_size and local_rank are the
    live ranks', which a multi-node job does not have: here they are None, and the function reads `env`."""
    recorder = _Recorder(0)
    holder = _Holder(recorder)
    return {
        "torch": _FakeTorch(holder),
        "dist": _FakeDist(holder),
        "rank": None,
        "world_size": None,
        "local_rank": None,
        "_record": holder,
    }


class _Holder:
    """The recorder of the call in progress: the stand-ins read through it, observe swaps it per call."""

    def __init__(self, recorder: _Recorder) -> None:
        object.__setattr__(self, "current", recorder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "current":
            object.__setattr__(self, name, value)
        else:
            setattr(self.current, name, value)
