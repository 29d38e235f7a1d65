"""A ``LightningDataModule`` as a run's data source, on the worker.

The DataModule is built here, from ``create_datamodule_fn``, and handed to ``Trainer.fit``:
Lightning runs ``prepare_data`` once per node (local rank 0, or global rank 0 only with
``prepare_data_per_node=False``), ``setup`` on every rank, and replaces the loaders' samplers
with a distributed one that splits by Ray's world rank and size and calls ``set_epoch`` each
epoch. Its loaders decide the batch size, so the global batch size is measured here, once
training starts, and goes into the reported metrics and the progress line.
"""

from __future__ import annotations

import logging
from typing import Any

from michelangelo.errors import InputTypeError
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback, load, package_of

logger = logging.getLogger(__name__)

__all__ = ["MeasuredBatchSize", "build_datamodule"]


def build_datamodule(factory: Any, kwargs: dict[str, Any], package: str) -> Any:
    """``factory(**kwargs)``, checked to be a ``LightningDataModule`` of the run's package.

    Raises:
        TypeError: The factory returned something else, or a DataModule of the other package.
    """
    datamodule = factory(**kwargs)
    if not isinstance(datamodule, load(package).LightningDataModule):
        built_on = package_of(datamodule)
        what = f"a {built_on} LightningDataModule" if built_on else "not a LightningDataModule"
        raise InputTypeError(
            f"create_datamodule_fn returned {type(datamodule).__name__} ({what}), but the run "
            f"trains with {package} (the package of the module create_model_fn returns). Fix: "
            f"return a {package}.LightningDataModule, imported from the same package as the "
            "LightningModule.")
    return datamodule


class MeasuredBatchSize(Callback):
    """At the start of training, read the loader's batch size and tell those who need it.

    Args:
        world_size: Ray Train's number of workers.
        accumulate: ``accumulate_grad_batches``.
        metrics: A dict every checkpoint report adds to its metrics (``Reporter.extra_metrics``).
        progress: The progress callbacks, whose ``rows_per_batch`` this sets.
    """

    def __init__(self, world_size: int, accumulate: int, metrics: dict[str, Any],
                 progress: list[Any]) -> None:
        self.world_size = world_size
        self.accumulate = accumulate
        self.metrics = metrics
        self.progress = progress

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        batch_size = getattr(trainer.train_dataloader, "batch_size", None)
        if not isinstance(batch_size, int):  # a batch_sampler decides; nothing to multiply
            return
        self.metrics["global_batch_size"] = batch_size * self.world_size * self.accumulate
        for callback in self.progress:
            callback.rows_per_batch = batch_size * self.world_size
        if trainer.is_global_zero:
            logger.info("global batch size = %d (the DataModule's per-device %d x %d workers "
                        "x %d accumulation)", self.metrics["global_batch_size"], batch_size,
                        self.world_size, self.accumulate)
            for lg in trainer.loggers:
                try:
                    lg.log_hyperparams({"global_batch_size": self.metrics["global_batch_size"]})
                except Exception:  # noqa: BLE001 - a logger without hparams support
                    logger.debug("logger %r took no hyperparameters", lg)
