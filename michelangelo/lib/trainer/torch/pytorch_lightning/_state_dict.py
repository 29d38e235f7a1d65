"""``LightningTrainerWithStateDict``: train, then pour the trained weights into a plain model.

Which loader runs depends on the strategy the run used (see ``michelangelo.lib.checkpoints``): a single
file for ddp, a DCP folder for fsdp2, a ZeRO folder converted to fp32 for deepspeed, and a file
or DCP folder for fsdp. The format found on disk is checked against the strategy, so loading a
checkpoint with the wrong strategy fails with a message instead of producing garbage.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import (
    align_state_dict_keys,
    load_state_dict,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._trainer import LightningTrainer

logger = logging.getLogger(__name__)

__all__ = ["LightningTrainerWithStateDict"]


class LightningTrainerWithStateDict(LightningTrainer):
    """A :class:`LightningTrainer` that can load its final weights into a ``torch.nn.Module``.

    Call :meth:`train` first, then :meth:`update_model_state_dict` with a freshly built model.
    The model can be the LightningModule class itself or the plain module it wraps (the
    module stored as an attribute such as ``self.net``); see :meth:`update_model_state_dict`.
    """

    _latest_checkpoint: Any = None
    _train_result: dict[str, Any] | None = None

    def fit(self):
        """Run training; keep the latest Ray checkpoint so remote storage loads correctly."""
        result = super().fit()
        # Ray's Checkpoint carries its filesystem; the path string alone loses the URL scheme
        # of remote storage (s3://bucket/... becomes bucket/...).
        self._latest_checkpoint = result.checkpoint
        return result

    def train(self, run_config: Any = None) -> dict[str, Any]:
        """Run training like :meth:`LightningTrainer.train` and remember the result.

        Returns:
            ``{"checkpoint_path", "path", "metrics"}``, as ``LightningTrainer.train``.
        """
        result = super().train(run_config)
        self._train_result = result
        return result

    @property
    def train_result(self) -> dict[str, Any] | None:
        """What the last :meth:`train` returned, or ``None`` before training."""
        return self._train_result

    def update_model_state_dict(self, model: torch.nn.Module) -> None:
        """Load the latest checkpoint's weights into ``model``, in place.

        The loader is picked from ``trainer_param.lightning_trainer_kwargs["strategy"]``
        (a string or a ``Strategy`` instance). Keys are matched in two steps: first as saved
        (the LightningModule's attribute names, e.g. ``net.0.weight``); if stripping one
        common leading prefix (e.g. ``net.``) matches more of ``model``'s keys, that prefix
        is removed, so the inner module works as a target too. Weights load with
        ``strict=False``; one log line lists the missing and unexpected keys.

        Args:
            model: The model to fill. Its tensors keep their device and dtype.

        Raises:
            ValueError: If called before :meth:`train`, if the run reported no checkpoint,
                or if the checkpoint's format does not match the strategy.
        """
        if self._train_result is None:
            raise InputError(
                "update_model_state_dict() was called before train(): there is no checkpoint to "
                "load yet. Fix: call trainer.train() first, then update_model_state_dict(model)."
            )
        source = self._latest_checkpoint or self._train_result.get("checkpoint_path")
        if source is None:
            raise InputError(
                "train() finished without reporting a checkpoint, so there are no weights to "
                "load. Fix: keep checkpointing on (do not set max_epochs=0, and let a "
                "ModelCheckpoint callback save at least once if you pass one)."
            )
        strategy = self.trainer_param.lightning_trainer_kwargs.get("strategy")
        state_dict = load_state_dict(source, strategy)
        aligned, prefix = align_state_dict_keys(state_dict, model.state_dict().keys())
        outcome = model.load_state_dict(aligned, strict=False)
        missing, unexpected = list(outcome.missing_keys), list(outcome.unexpected_keys)
        level = logging.WARNING if missing or unexpected else logging.INFO
        logger.log(
            level,
            "update_model_state_dict: loaded %d tensors into %s from %s (strategy=%s, "
            "removed prefix=%r, strict=False); missing keys: %s; unexpected keys: %s",
            len(aligned) - len(unexpected),
            type(model).__name__,
            self._train_result.get("checkpoint_path"),
            strategy if strategy is None or isinstance(strategy, str) else type(strategy).__name__,
            prefix,
            missing,
            unexpected,
        )
