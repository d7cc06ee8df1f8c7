"""Datasets for the workers: synthetic images, and a small real dataset that ships with the package (UCI
handwritten digits)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DistributedSampler, TensorDataset

DIGITS_FILE = Path(__file__).parent / "shipped_data" / "digits.csv.gz"
DATASETS = ("synthetic", "digits")
DIGITS_TEST = 299  # odd on purpose: 2 ranks cannot split it evenly, so padding would show
DIGITS_MEAN, DIGITS_STD = 4.884, 6.017  # over all 1,797 images: both splits are scaled alike


@dataclass
class DatasetInfo:
    dataset: TensorDataset
    shape: tuple[int, int, int]  # channels, height, width
    num_classes: int
    name: str


def synthetic_images(
    num_samples: int = 2048,
    image_size: int = 32,
    num_classes: int = 10,
    channels: int = 3,
    seed: int = 0,
    split: str = "train",
) -> DatasetInfo:
    """Random images with a per-class pattern added, so a model can really learn them."""
    if num_samples < 1 or image_size < 1 or num_classes < 2:  # train.py's --num-samples, --image-size
        raise ValueError("need num_samples >= 1, image_size >= 1 and num_classes >= 2")
    patterns = torch.randn(
        num_classes, channels, image_size, image_size, generator=torch.Generator().manual_seed(seed)
    )
    gen = torch.Generator().manual_seed(seed + (0 if split == "train" else 1_000_003))
    labels = torch.randint(0, num_classes, (num_samples,), generator=gen)
    noise = torch.randn(num_samples, channels, image_size, image_size, generator=gen)
    images = 0.1 * patterns[labels] + noise  # faint patterns: learnable, not instant
    return DatasetInfo(
        TensorDataset(images, labels), (channels, image_size, image_size), num_classes, "synthetic"
    )


def digits(channels: int = 1, split: str = "train") -> DatasetInfo:
    """The UCI optical-recognition handwritten digits: 1,797 real 8x8 images, 10 classes, offline."""
    with gzip.open(DIGITS_FILE, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    order = np.random.default_rng(0).permutation(len(table))
    table = table[order[:-DIGITS_TEST]] if split == "train" else table[order[-DIGITS_TEST:]]
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    pixels = (pixels - DIGITS_MEAN) / DIGITS_STD
    images = torch.from_numpy(pixels).reshape(-1, 1, 8, 8).repeat(1, channels, 1, 1)
    return DatasetInfo(TensorDataset(images, torch.from_numpy(labels)), (channels, 8, 8), 10, "digits")


def build_dataset(
    name: str, *, num_samples: int, image_size: int, channels: int, seed: int, split: str = "train"
) -> DatasetInfo:
    """The dataset a worker asked for by name."""
    if name == "synthetic":
        return synthetic_images(num_samples, image_size, channels=channels, seed=seed, split=split)
    if name == "digits":
        return digits(channels, split)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can begin an epoch part-way through, for an exact mid-epoch resume."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def start_at(self, index: int) -> None:
        if not 0 <= index <= self.num_samples:
            raise ValueError(f"start index {index} is outside this rank's {self.num_samples} samples")
        self._skip = index

    def __iter__(self):
        indices = list(super().__iter__())[self._skip :]
        self._skip = 0  # later epochs start from the beginning
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples - self._skip
