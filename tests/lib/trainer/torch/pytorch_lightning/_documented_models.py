"""LightningModules written as Lightning's documentation writes them, nothing bent for the SDK.

Each class follows one documented pattern and uses what only a running Trainer has
(``self.device_mesh``, ``self.trainer``, ``self.global_rank``) exactly where the docs do, with
no guard for a caller that builds the module outside a distributed run. The tests in
``test_documented_models.py`` train each through ``LightningTrainer`` with the strategies it
fits. Factories are module-level functions, as ``create_model_fn`` needs.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from _models import FEATURES, ship_by_value
from torch import nn

ship_by_value(__name__)


def _mlp(hidden_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))


class _Regression(pl.LightningModule):
    """The steps every module below shares: MSE on ``x`` -> ``y``, logged per epoch."""

    net: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch["x"].float()), batch["y"].float())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch["x"].float()), batch["y"].float())
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class _Delayed(_Regression):
    """Delayed initialisation: no layers until ``configure_model()`` creates them."""

    def __init__(self, hidden_dim: int = 8, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = None


class ShardedInConfigureModel(_Delayed):
    """FSDP2 (``ModelParallelStrategy``): layers created and sharded in ``configure_model()``.

    The docs' delayed-initialisation form: ``configure_model()`` may be called more than once,
    so it returns early when the layers exist.
    """

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        if self.net is not None:
            return
        self.net = _mlp(self.hparams.hidden_dim)
        mesh = self.device_mesh["data_parallel"]
        for module in self.net.modules():
            if isinstance(module, nn.Linear):
                fully_shard(module, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


class TrainerSizedModel(_Delayed):
    """``configure_model()`` that reads ``self.trainer`` to size the layers it creates."""

    def configure_model(self):
        if self.net is not None:
            return
        width = max(self.hparams.hidden_dim, self.trainer.world_size)
        self.net = _mlp(width)


class OneCycleModel(_Regression):
    """``configure_optimizers()`` sizing a per-step schedule with ``estimated_stepping_batches``."""

    def __init__(self, hidden_dim: int = 8, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = _mlp(hidden_dim)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.lr,
            total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class RankZeroPrintingModel(_Regression):
    """Prints from rank zero only, with ``self.global_rank``, as the docs' hook examples do."""

    def __init__(self, hidden_dim: int = 8, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = _mlp(hidden_dim)

    def on_train_epoch_end(self):
        if self.global_rank == 0:
            self.print(f"epoch {self.current_epoch} finished on {self.trainer.world_size} ranks")


class MistypedConfigureModel(TrainerSizedModel):
    """A genuine bug in ``configure_model()``: a misspelt hyperparameter."""

    def configure_model(self):
        if self.net is not None:
            return
        self.net = _mlp(self.hparams.hiden_dim)


def create_sharded_in_configure(hidden_dim: int = 8, lr: float = 1e-2):
    return ShardedInConfigureModel(hidden_dim, lr)


def create_trainer_sized(hidden_dim: int = 8, lr: float = 1e-2):
    return TrainerSizedModel(hidden_dim, lr)


def create_one_cycle(hidden_dim: int = 8, lr: float = 1e-2):
    return OneCycleModel(hidden_dim, lr)


def create_rank_zero_printing(hidden_dim: int = 8, lr: float = 1e-2):
    return RankZeroPrintingModel(hidden_dim, lr)


def create_mistyped(hidden_dim: int = 8, lr: float = 1e-2):
    return MistypedConfigureModel(hidden_dim, lr)
