"""Small models shared by the tests."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.c1(x)))
        y = nn.functional.max_pool2d(y, 2)
        return self.c2(y).flatten(1).softmax(-1)


class WithEagerOp(nn.Module):
    """Two lowerable blocks around an op that must stay in PyTorch (listed in torch_executed_ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.a(x)) * 2 + 1
        y = torch.sigmoid(y)  # forced to PyTorch in the tests
        return torch.relu(self.b(y)) - 0.5


def eval_model(model: nn.Module, dtype: torch.dtype = torch.float32, device: str = "cpu") -> nn.Module:
    return model.eval().to(device=device, dtype=dtype)
