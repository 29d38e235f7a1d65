"""Importable model factories for the registry tests (the registry stores them by name)."""

from __future__ import annotations

import torch
from torch import nn


class TiedLM(nn.Module):
    """An embedding whose output projection shares the embedding matrix (tied weights)."""

    def __init__(self, vocab: int = 11, dim: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def create_mlp(features: int = 8, hidden: int = 4) -> nn.Module:
    """A two-layer MLP: ``(batch, features) -> (batch, 1)``."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def create_tied(vocab: int = 11, dim: int = 4) -> nn.Module:
    return TiedLM(vocab, dim)


class TwoInputs(nn.Module):
    """Called as ``model(a=..., b=...)``: the dict-example form."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": self.lin(a) + self.lin(b), "ids": b.argmax(-1)}


def create_lightning(hidden: int = 4, lr: float = 0.05):
    """A tiny Lightning regressor (``net`` is the inner MLP)."""
    import pytorch_lightning as pl

    class _Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = create_mlp(8, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=lr)

    return _Regressor()
