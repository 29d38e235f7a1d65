"""Checkpoint reporting to Ray Train from inside Lightning.

Every report follows one layout: every rank calls ``trainer.save_checkpoint`` with the same
path, ``<tmp>/<checkpoint dir name>/checkpoint.ckpt`` (Lightning broadcasts rank 0's path, so
the folder must exist under that name on every host). Sharded strategies write each rank's
shard there; DDP writes one file from rank 0. Local rank 0 of each host then reports the
folder, and Ray merges the hosts' folders into one persisted checkpoint folder.

When the user gave a ``ModelCheckpoint``, a report follows each of its saves (so its
``monitor`` decides when, and Ray's ``checkpoint_score_attribute`` sees the same metric);
otherwise a report is made at the end of every training epoch.
"""

from __future__ import annotations

import datetime
import logging
import os
import posixpath
import shutil
import tempfile
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback, classes

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.ckpt"

__all__ = ["CHECKPOINT_NAME", "EpochEndReport", "MetricsOnlyReport", "Reporter",
           "report_on_model_checkpoint", "take_debug_metrics"]


def _dir_name() -> str:
    # Ray Train V2's own naming (local time, microseconds), so tools that sort Ray's
    # checkpoint folders by name keep working.
    return "checkpoint_" + datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")


def _as_float(value: Any) -> Any:
    try:
        return value.item()
    except (AttributeError, ValueError, RuntimeError):
        return value


class Reporter:
    """Saves and reports one checkpoint on every rank; tells the observer.

    Args:
        experiment_dir: ``<storage_path>/<name>``, where Ray persists the checkpoints.
        observer: Optional ``TrainingObserver``.
        extra_metrics: Added to every report (e.g. ``global_batch_size``).
    """

    def __init__(self, experiment_dir: str | None, observer: Any = None,
                 extra_metrics: dict[str, Any] | None = None) -> None:
        self.experiment_dir = experiment_dir
        self.observer = observer
        self.extra_metrics = dict(extra_metrics or {})
        self.last_step: int | None = None

    def metrics(self, trainer: Any) -> dict[str, Any]:
        metrics = {k: _as_float(v) for k, v in trainer.callback_metrics.items()}
        metrics.update(self.extra_metrics)
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        return metrics

    def report(self, trainer: Any) -> None:
        import ray.train

        # Two saves at one step (e.g. top-k and save_last) hold the same state: report once.
        # global_step is equal on all ranks, so every rank skips alike.
        if self.last_step == trainer.global_step:
            return
        self.last_step = trainer.global_step
        name = trainer.strategy.broadcast(_dir_name() if trainer.is_global_zero else None, src=0)
        metrics = self.metrics(trainer)
        # The same folder name on every rank and host; `name` is unique to this report.
        tmp = os.path.join(tempfile.gettempdir(), f"michelangelo-{name}")
        os.makedirs(tmp, exist_ok=True)
        reports = ray.train.get_context().get_local_rank() == 0
        try:
            trainer.save_checkpoint(os.path.join(tmp, CHECKPOINT_NAME), weights_only=False)
            trainer.strategy.barrier()  # every shard on this host is written
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp) if reports else None,
                checkpoint_dir_name=name,
            )
            trainer.strategy.barrier()
        finally:
            if reports:
                shutil.rmtree(tmp, ignore_errors=True)
        path = posixpath.join(self.experiment_dir, name) if self.experiment_dir else name
        if self.observer is not None:
            self.observer.on_checkpoint_saved(
                metrics["epoch"], metrics["step"], dict(metrics), path
            )


_DEBUG_NAMESPACE = "michelangelo_debug_metrics"


class MetricsOnlyReport(Callback):
    """Hand the metrics, without a checkpoint, to the driver once training ends.

    For a ``fast_dev_run``, which writes no checkpoint. Ray Train keeps a run's metrics with
    its checkpoints only, so global rank 0 puts them in Ray's key-value store under ``key``,
    where :func:`take_debug_metrics` finds them on the driver.
    """

    def __init__(self, reporter: Reporter, key: str) -> None:
        self.reporter = reporter
        self.key = key

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        import json

        from ray.experimental import internal_kv

        if trainer.is_global_zero:
            metrics = {k: v for k, v in self.reporter.metrics(trainer).items()
                       if isinstance(v, int | float | str | bool)}
            internal_kv._internal_kv_put(self.key, json.dumps(metrics), overwrite=True,
                                         namespace=_DEBUG_NAMESPACE)


def take_debug_metrics(key: str) -> dict[str, Any]:
    """The metrics a :class:`MetricsOnlyReport` left under ``key`` (removed), or ``{}``."""
    import json

    from ray.experimental import internal_kv

    try:
        raw = internal_kv._internal_kv_get(key, namespace=_DEBUG_NAMESPACE)
        internal_kv._internal_kv_del(key, namespace=_DEBUG_NAMESPACE)
    except Exception:  # noqa: BLE001 - no Ray connection: nothing was left
        return {}
    return json.loads(raw) if raw else {}


class EpochEndReport(Callback):
    """Report a checkpoint at the end of every training epoch (after its validation)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.reporter.report(trainer)


_SUBCLASSES: dict[type, type] = {}


def _reporting_subclass(cls: type) -> type:
    if cls not in _SUBCLASSES:

        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            cls._save_checkpoint(self, trainer, filepath)
            self._michelangelo_reporter.report(trainer)

        _SUBCLASSES[cls] = type(cls.__name__, (cls,), {"_save_checkpoint": _save_checkpoint})
    return _SUBCLASSES[cls]


def report_on_model_checkpoint(callbacks: list[Any], reporter: Reporter) -> bool:
    """Make every ``ModelCheckpoint`` in ``callbacks`` report after each of its saves.

    The instance's class is swapped for a same-named subclass on this worker only; the
    user's object, its arguments and its state are untouched otherwise.

    Returns:
        Whether any ``ModelCheckpoint`` was found.
    """
    model_checkpoint = classes("callbacks.ModelCheckpoint")
    found = False
    for callback in callbacks:
        if isinstance(callback, model_checkpoint):
            callback._michelangelo_reporter = reporter
            callback.__class__ = _reporting_subclass(type(callback))
            found = True
    return found
