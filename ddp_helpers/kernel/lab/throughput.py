"""What notebook 02's throughput runs run on, decided once from the GPU count and nproc: a pure plan.

Its rules, tested over GPUs in {0, 1, 2, 4, 8} x nproc in {1, 2, 3, 8} (tests/chapters/ch02_single_dp_ddp/test_ch02_throughput_plan.py):

- nothing is compared across device kinds: the single process, DataParallel, DDP and every point of
  the scaling sweep compute on the same kind of device;
- NCCL (launch's "auto" with GPUs) only where every DDP rank has a GPU of its own; with fewer GPUs than
  ranks every run goes to the CPU, and the GPUs are hidden from it (``CUDA_VISIBLE_DEVICES=""``), since
  DataParallel would otherwise reach for GPUs that do not hold its module;
- DataParallel splits over exactly the GPUs DDP uses (the first nproc), and over none on the CPU;
- on the CPU a device is one core: every process runs one thread;
- the sizes (model, image side, samples, batch per device) go by the device kind alone (THROUGHPUT_SIZES).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_helpers.kernel.lab.plan_core import RunPlan, by_kind

# The throughput runs' sizes. The CPU's are short steps for a core each (CI times them). A GPU needs
# steps long enough for DDP's all-reduce to hide behind backward: ResNet-18 at 32 px and batch 32 is a
# few ms of work on an H100, so DDP looked as if it did not scale there. ResNet-50 at 224 px saves about
# 82 MiB of fp32 activations per image for backward (42 MiB under bf16 autocast; counted with autograd's
# saved_tensors_hooks on torch 2.14.1), so 128 images per GPU hold ~11 GiB in fp32, comfortable in 80 GB.
# 2048 images of 3x224x224 are 1.2 GB of host memory in each rank (the dataset is built in memory).
THROUGHPUT_SIZES = {
    "cpu": {"model": "resnet18", "image_size": 32, "num_samples": 2048, "batch_size": 32},
    "cuda": {"model": "resnet50", "image_size": 224, "num_samples": 2048, "batch_size": 128},
}
# smoke mode (CI, on the CPU): the MLP; a GPU keeps its sizes, which it runs in seconds
SMOKE_SIZES = {"cpu": {**THROUGHPUT_SIZES["cpu"], "model": "mlp"}, "cuda": THROUGHPUT_SIZES["cuda"]}


@dataclass(frozen=True)
class ThroughputPlan:
    device: str  # every run's device kind
    line: str  # one sentence that says where the runs go, and why
    single: RunPlan
    dp: RunPlan
    ddp: RunPlan
    sweep: dict[int, RunPlan]  # processes -> run; 1 and nproc are the single and DDP runs
    sizes: dict[str, Any] = field(default_factory=dict)  # model, image_size, num_samples, batch_size

    def runs(self) -> list[RunPlan]:
        return [self.single, self.dp, self.ddp, *self.sweep.values()]


def sweep_points(nproc: int) -> list[int]:
    """1, 2, 4, ... up to nproc, and nproc itself."""
    return sorted({n for n in (1, 2, 4, 8, 16, 32) if n <= nproc} | {nproc})


def throughput_sizes(device: str, smoke: bool = False) -> dict[str, Any]:
    """The throughput runs' sizes on `device` ("cpu" or "cuda")."""
    return by_kind(device, SMOKE_SIZES if smoke else THROUGHPUT_SIZES)


def throughput_plan(gpus: int, nproc: int, smoke: bool = False) -> ThroughputPlan:
    if gpus < 0 or nproc < 1:
        raise ValueError(f"expected gpus >= 0 and nproc >= 1, got gpus={gpus}, nproc={nproc}")
    if gpus >= nproc:  # one GPU per rank: NCCL, and DataParallel over the same GPUs
        dp_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(nproc)))} if gpus > nproc else {}

        def ddp(n: int) -> RunPlan:
            return RunPlan(n, "auto", "cuda", n)

        return ThroughputPlan(
            device="cuda",
            line=f"every run on GPUs: DDP with nccl, one GPU per rank ({gpus} visible).",
            single=RunPlan(1, "auto", "cuda", 1),
            dp=RunPlan(1, "auto", "cuda", nproc, dp_env),
            ddp=ddp(nproc),
            sweep={n: ddp(n) for n in sweep_points(nproc)},
            sizes=throughput_sizes("cuda", smoke),
        )
    # the CPU: no GPU at all, or fewer GPUs than ranks (then hidden, and gloo named explicitly)
    backend = "gloo" if gpus else "auto"
    env = {"OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if gpus else {})}

    def cpu(n: int) -> RunPlan:
        return RunPlan(n, backend, "cpu", n, dict(env))

    why = (
        f"{nproc} ranks but {gpus} GPU(s): NCCL needs one GPU per rank, so every run (single and "
        "DataParallel too, with the GPUs hidden) goes to the CPU, one core per process, to compare like with like."
        if gpus
        else "every run on the CPU with gloo (no GPU here), one core per process."
    )
    return ThroughputPlan(
        device="cpu",
        line=why,
        single=cpu(1),
        dp=RunPlan(1, backend, "cpu", 1, dict(env)),
        ddp=cpu(nproc),
        sweep={n: cpu(n) for n in sweep_points(nproc)},
        sizes=throughput_sizes("cpu", smoke),
    )
