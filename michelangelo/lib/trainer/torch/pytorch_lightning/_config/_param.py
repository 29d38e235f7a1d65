"""``LightningTrainerParam``: what a LightningTrainer run trains, on which data, and how."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._config._signature_check import (
    check_kwargs,
    signature_of,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._specs import (
    IncrementalTrainingSpec,
    TransferLearningSpec,
)

__all__ = ["LightningTrainerParam"]

logger = logging.getLogger(__name__)

_UNSET: Any = object()  # tells "num_epochs was passed" from the default


@dataclass(frozen=True)
class LightningTrainerParam:
    """The training run: model factory, data, batch size and Lightning arguments.

    Args:
        create_model_fn: Factory returning a ``pytorch_lightning.LightningModule``; called on
            every worker as ``create_model_fn(**create_model_fn_kwargs)``. The model itself
            never crosses a process boundary.
        create_model_fn_kwargs: Keyword arguments for the factory, checked against its
            signature here (unknown keys, missing required parameters).
        train_data: Training ``ray.data.Dataset`` (split evenly across workers).
        val_data: Validation ``ray.data.Dataset``. Required, but may be None: an explicit
            choice to train without validation, which ``LightningTrainer`` warns about.
        batch_size: Per-worker batch size (default 8).
        num_shuffle_batches: Batches held in Ray Data's local shuffle buffer
            (``num_shuffle_batches * batch_size`` rows); 0 turns shuffling off (default 10).
        num_epochs: Deprecated: use ``lightning_trainer_kwargs={"max_epochs": N}``. Warns
            when passed; still honoured when ``max_epochs`` is not given. Reads back as 1
            when not passed.
        data_collate_fn: Turns a batch (dict of numpy arrays) into what ``training_step``
            receives; must be thread-safe (Ray prefetches on a thread). Default: Ray Data's
            dict of tensors.
        lightning_trainer_kwargs: Arguments for ``pytorch_lightning.Trainer``, plus the
            siblings ``strategy_kwargs``, ``logger_kwargs`` and ``profiler_kwargs``.
        initial_weights_path: State dict to warm-start from: local path, ``file://`` or any
            fsspec URL. Read once by rank 0 and broadcast.
        transfer_learning_spec: Layers to freeze after the factory returns.
        incremental_training_spec: Accepted, not used yet.
        training_observer: A :class:`TrainingObserver`.
        experiment_store: An ``ExperimentStore`` enabling auto-resume across runs.
        profiler_sink: ``sink(trainer, profiler_dir)`` run after ``fit()`` on each node-local
            rank 0 when a profiler is configured.

    Raises:
        ValueError: A field has a wrong type or value (the message names field and fix).
    """

    create_model_fn: Callable[..., Any]
    create_model_fn_kwargs: dict[str, Any]
    train_data: Any
    val_data: Any
    batch_size: int = 8
    num_shuffle_batches: int = 10
    num_epochs: int = _UNSET
    data_collate_fn: Callable[[Any], Any] | None = None
    lightning_trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    initial_weights_path: str | None = None
    transfer_learning_spec: TransferLearningSpec | None = None
    incremental_training_spec: IncrementalTrainingSpec | None = None
    training_observer: Any = None
    experiment_store: Any = None
    profiler_sink: Callable[[Any, str], Any] | None = None
    # Whether num_epochs was passed explicitly (it then overrides the max_epochs default).
    num_epochs_given: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_epochs is _UNSET:
            object.__setattr__(self, "num_epochs", 1)
        else:
            _check_count("num_epochs", self.num_epochs, minimum=1, fix="pass an int >= 1")
            message = (
                f"LightningTrainerParam.num_epochs={self.num_epochs!r} is deprecated. Use "
                f"lightning_trainer_kwargs={{'max_epochs': {self.num_epochs!r}}} instead."
            )
            # FutureWarning, not DeprecationWarning: Python hides the latter from end users.
            warnings.warn(message, FutureWarning, stacklevel=3)
            logger.warning(message)
            object.__setattr__(self, "num_epochs_given", True)
        if not callable(self.create_model_fn):
            raise InputError(
                f"LightningTrainerParam.create_model_fn must be callable, got "
                f"{self.create_model_fn!r}. Fix: pass a function that returns a LightningModule."
            )
        if self.create_model_fn_kwargs is None:
            object.__setattr__(self, "create_model_fn_kwargs", {})
        _check_dict("create_model_fn_kwargs", self.create_model_fn_kwargs)
        check_kwargs(self.create_model_fn, self.create_model_fn_kwargs,
                     label="LightningTrainerParam.create_model_fn_kwargs",
                     target=f"create_model_fn {_describe_factory(self.create_model_fn)}")
        _check_dataset("train_data", self.train_data, optional=False)
        _check_dataset("val_data", self.val_data, optional=True)
        _check_count("batch_size", self.batch_size, minimum=1, fix="pass an int >= 1")
        _check_count("num_shuffle_batches", self.num_shuffle_batches, minimum=0,
                     fix="pass an int >= 0 (0 turns shuffling off)")
        for name in ("data_collate_fn", "profiler_sink"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InputError(f"LightningTrainerParam.{name} must be callable or None, got "
                                 f"{value!r}. Fix: pass a function or leave it unset.")
        if self.lightning_trainer_kwargs is None:
            object.__setattr__(self, "lightning_trainer_kwargs", {})
        _check_dict("lightning_trainer_kwargs", self.lightning_trainer_kwargs)
        if self.initial_weights_path is not None and (
            not isinstance(self.initial_weights_path, str) or not self.initial_weights_path
        ):
            raise InputError(
                f"LightningTrainerParam.initial_weights_path must be a non-empty string, got "
                f"{self.initial_weights_path!r}. Fix: a local path or a URL like s3://b/model.pt."
            )
        _check_type("transfer_learning_spec", self.transfer_learning_spec, TransferLearningSpec)
        _check_type("incremental_training_spec", self.incremental_training_spec,
                    IncrementalTrainingSpec)
        self._check_observer()
        self._check_store()

    @property
    def shuffle_buffer_rows(self) -> int | None:
        """Rows in Ray Data's local shuffle buffer, or None when shuffling is off."""
        return self.num_shuffle_batches * self.batch_size or None

    def _check_observer(self) -> None:
        observer = self.training_observer
        if observer is None:
            return
        missing = [m for m in ("on_result", "on_checkpoint_saved")
                   if not callable(getattr(observer, m, None))]
        if missing:
            raise InputError(
                f"LightningTrainerParam.training_observer={observer!r} lacks {missing}. "
                "Fix: implement on_result(metrics, checkpoint_path) and "
                "on_checkpoint_saved(epoch, step, metrics, checkpoint_path)."
            )

    def _check_store(self) -> None:
        store = self.experiment_store
        if store is None:
            return
        missing = [m for m in ("track", "locate_resumable")
                   if not callable(getattr(store, m, None))]
        if missing:
            raise InputError(
                f"LightningTrainerParam.experiment_store={store!r} lacks {missing}. Fix: use "
                "FsspecExperimentStore() or implement track() and locate_resumable()."
            )


def _describe_factory(fn: Callable[..., Any]) -> str:
    """``name(params)`` of the factory, for messages."""
    name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None),
                                                        "__qualname__", None) or repr(fn)
    signature = signature_of(fn)
    if signature is None:
        return name
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return name + str(signature.replace(parameters=bare, return_annotation=signature.empty))


def _check_count(name: str, value: Any, *, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"LightningTrainerParam.{name} must be an int >= {minimum}, got "
                         f"{value!r}. Fix: {fix}.")


def _check_dict(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise InputError(f"LightningTrainerParam.{name} must be a dict, got "
                         f"{type(value).__name__}: {value!r}. Fix: pass a dict (or {{}}).")


def _check_type(name: str, value: Any, expected: type) -> None:
    if value is not None and not isinstance(value, expected):
        raise InputError(f"LightningTrainerParam.{name} must be a {expected.__name__} or None, "
                         f"got {value!r}. Fix: build one with {expected.__name__}(...).")


def _check_dataset(name: str, value: Any, *, optional: bool) -> None:
    from ray.data import Dataset

    if value is None and optional:
        return
    if not isinstance(value, Dataset):
        raise InputError(
            f"LightningTrainerParam.{name} must be a ray.data.Dataset, got "
            f"{type(value).__name__}. Fix: wrap the data with ray.data.from_pandas(...) / "
            "ray.data.read_parquet(...)" + (" or pass None." if optional else ".")
        )
