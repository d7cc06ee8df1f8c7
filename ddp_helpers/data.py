"""Datasets for the workers: synthetic images, a small real dataset that ships with the
package (UCI handwritten digits), and CIFAR-10 when it is already on disk.

Every builder returns a `DatasetInfo`, so the worker can size its model from the data.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

DIGITS_FILE = Path(__file__).parent / "shipped_data" / "digits.csv.gz"
DATASETS = ("synthetic", "digits", "cifar10")


@dataclass
class DatasetInfo:
    dataset: Dataset
    shape: tuple[int, int, int]  # channels, height, width
    num_classes: int
    name: str


def synthetic_images(
    num_samples: int = 2048, image_size: int = 32, num_classes: int = 10, channels: int = 3, seed: int = 0
) -> DatasetInfo:
    """Random images with a per-class pattern added, so a model can really learn them.

    Generated from `seed` alone: every rank builds the identical dataset without any I/O.
    """
    if num_samples < 1 or image_size < 1 or num_classes < 2:
        raise ValueError("need num_samples >= 1, image_size >= 1 and num_classes >= 2")
    gen = torch.Generator().manual_seed(seed)
    patterns = torch.randn(num_classes, channels, image_size, image_size, generator=gen)
    labels = torch.randint(0, num_classes, (num_samples,), generator=gen)
    noise = torch.randn(num_samples, channels, image_size, image_size, generator=gen)
    images = 0.1 * patterns[labels] + noise  # faint patterns: learnable, not instant
    return DatasetInfo(
        TensorDataset(images, labels), (channels, image_size, image_size), num_classes, "synthetic"
    )


def digits(channels: int = 1) -> DatasetInfo:
    """The UCI optical-recognition handwritten digits: 1,797 real 8x8 images, 10 classes, offline.

    Pixels 0..16 are scaled to zero mean and unit variance. `channels=3` repeats the grey
    channel for models that expect RGB.
    """
    with gzip.open(DIGITS_FILE, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    pixels = (pixels - pixels.mean()) / pixels.std()
    images = torch.from_numpy(pixels).reshape(-1, 1, 8, 8).repeat(1, channels, 1, 1)
    return DatasetInfo(TensorDataset(images, torch.from_numpy(labels)), (channels, 8, 8), 10, "digits")


def cifar10(root: str | os.PathLike[str] | None = None, train: bool = True) -> DatasetInfo:
    """CIFAR-10 from `root` (default: $DDP_HELPERS_DATA or ./data). Never downloads: this must work offline."""
    from torchvision import datasets, transforms

    root = Path(root or os.environ.get("DDP_HELPERS_DATA", "data"))
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))]
    )
    try:
        dataset = datasets.CIFAR10(str(root), train=train, download=False, transform=transform)
    except RuntimeError as err:
        raise FileNotFoundError(
            f"CIFAR-10 is not in {root}. Download it once with "
            f"torchvision.datasets.CIFAR10('{root}', download=True), or use --dataset synthetic or digits."
        ) from err
    return DatasetInfo(dataset, (3, 32, 32), 10, "cifar10")


def build_dataset(name: str, *, num_samples: int, image_size: int, channels: int, seed: int) -> DatasetInfo:
    """The dataset a worker asked for by name."""
    if name == "synthetic":
        return synthetic_images(num_samples, image_size, channels=channels, seed=seed)
    if name == "digits":
        return digits(channels)
    if name == "cifar10":
        return cifar10()
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
