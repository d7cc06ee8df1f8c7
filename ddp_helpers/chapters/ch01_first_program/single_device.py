"""Train a small classifier on one device: the program that ddp.py turns into DDP. Torch only: copy it anywhere.

python single_device.py --epochs 3
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(size: int = 2048, features: int = 20, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Points around one centre per class: built from a seed, so no download and the same everywhere."""
    gen = torch.Generator().manual_seed(seed)
    centres = 2 * torch.randn(classes, features, generator=gen)
    labels = torch.randint(classes, (size,), generator=gen)
    return TensorDataset(centres[labels] + torch.randn(size, features, generator=gen), labels)


def train(args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    dataset = make_dataset()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    model: nn.Module = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        totals = torch.zeros(2, device=device)  # the epoch's summed loss and its sample count
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), torch.tensor(len(y), device=device)])
        print(f"epoch {epoch}: loss {totals[0] / totals[1]:.4f} (mean over {int(totals[1])} samples)")

    torch.save(model.state_dict(), args.save)
    print(f"saved {args.save}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small classifier on one device.")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train(args, device)


if __name__ == "__main__":
    main()
