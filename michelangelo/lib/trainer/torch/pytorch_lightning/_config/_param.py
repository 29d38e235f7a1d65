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


class _NotGiven:
    """The default of ``train_data`` and ``val_data``: neither passed (a DataModule run)."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class LightningTrainerParam:
    """The training run: model factory, data, batch size and Lightning arguments.

    Args:
        create_model_fn: Factory returning a ``pytorch_lightning.LightningModule``; called on
            every worker as ``create_model_fn(**create_model_fn_kwargs)``. The model itself
            never crosses a process boundary.
        create_model_fn_kwargs: Keyword arguments for the factory, checked against its
            signature here (unknown keys, missing required parameters).
        train_data: Training ``ray.data.Dataset`` (split evenly across workers). Required
            unless ``create_datamodule_fn`` gives the data.
        val_data: Validation ``ray.data.Dataset``. Required with ``train_data``, but may be
            None: an explicit choice to train without validation, which ``LightningTrainer``
            warns about.
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
        create_datamodule_fn: Instead of ``train_data``/``val_data``: a factory returning a
            ``LightningDataModule`` of the module's package, called on every worker as
            ``create_datamodule_fn(**create_datamodule_fn_kwargs)`` and never pickled, like
            ``create_model_fn``. Lightning then runs it as it always does: ``prepare_data``
            once per node (once in all with ``prepare_data_per_node=False``), ``setup`` on
            every rank, and its distributed sampler shards the loaders by Ray's ranks.
            ``batch_size``, ``num_shuffle_batches`` and ``data_collate_fn`` apply to Ray
            datasets only; the DataModule's loaders decide those.
        create_datamodule_fn_kwargs: Keyword arguments for ``create_datamodule_fn``, checked
            against its signature here.
        stall_timeout_s: Seconds a worker's fit may go without progress (a batch, a backward,
            an optimizer step, a validation batch) before the run fails with
            ``TrainingStalledError``, naming each rank's line of code (default 300). Ranks that
            stop stepping together, such as a collective on some ranks only, otherwise wait
            for the process group's timeout. Raise it for steps or checkpoint saves that take
            longer; None turns the watchdog off.

    Raises:
        ValueError: A field has a wrong type or value (the message names field and fix).
    """

    create_model_fn: Callable[..., Any]
    create_model_fn_kwargs: dict[str, Any]
    train_data: Any = _NOT_GIVEN
    val_data: Any = _NOT_GIVEN
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
    create_datamodule_fn: Callable[..., Any] | None = None
    create_datamodule_fn_kwargs: dict[str, Any] = field(default_factory=dict)
    stall_timeout_s: float | None = 300.0
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
        self._check_data_source()
        timeout = self.stall_timeout_s
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise InputError(
                f"LightningTrainerParam.stall_timeout_s must be a number of seconds > 0 or "
                f"None, got {timeout!r}. Fix: e.g. stall_timeout_s=600 for long steps, or None "
                "to turn the stall watchdog off.")
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
    def uses_datamodule(self) -> bool:
        """Whether the data comes from ``create_datamodule_fn`` (not from Ray datasets)."""
        return self.create_datamodule_fn is not None

    def _check_data_source(self) -> None:
        """Ray datasets or a DataModule factory: exactly one of the two."""
        if self.create_datamodule_fn_kwargs is None:
            object.__setattr__(self, "create_datamodule_fn_kwargs", {})
        _check_dict("create_datamodule_fn_kwargs", self.create_datamodule_fn_kwargs)
        given = [name for name in ("train_data", "val_data")
                 if getattr(self, name) is not _NOT_GIVEN]
        if self.create_datamodule_fn is None:
            if self.create_datamodule_fn_kwargs:
                raise InputError(
                    "LightningTrainerParam.create_datamodule_fn_kwargs="
                    f"{self.create_datamodule_fn_kwargs!r} is set without "
                    "create_datamodule_fn. Fix: pass create_datamodule_fn too, or drop the "
                    "kwargs.")
            if not given:
                raise InputError(
                    "LightningTrainerParam has no data: neither train_data/val_data nor "
                    "create_datamodule_fn is set. Fix: pass train_data=<ray.data.Dataset> and "
                    "val_data=<ray.data.Dataset or None>, or create_datamodule_fn=<a function "
                    "returning a LightningDataModule>.")
            if "val_data" not in given:
                raise InputError(
                    "LightningTrainerParam.val_data is required with train_data. Fix: pass a "
                    "validation ray.data.Dataset, or val_data=None to train without validation.")
            _check_dataset("train_data", self.train_data, optional=False)
            _check_dataset("val_data", self.val_data, optional=True)
            return
        if given:
            passed = " and ".join(f"{name}={getattr(self, name)!r}" for name in given)
            raise InputError(
                f"LightningTrainerParam has both create_datamodule_fn="
                f"{_describe_factory(self.create_datamodule_fn)} and {passed}: the data must "
                "come from one of them. Fix: drop train_data/val_data and let the DataModule's "
                "train_dataloader()/val_dataloader() give the data, or drop "
                "create_datamodule_fn.")
        if not callable(self.create_datamodule_fn):
            raise InputError(
                f"LightningTrainerParam.create_datamodule_fn must be callable, got "
                f"{self.create_datamodule_fn!r}. Fix: pass a function (or the class) that "
                "returns a LightningDataModule.")
        check_kwargs(self.create_datamodule_fn, self.create_datamodule_fn_kwargs,
                     label="LightningTrainerParam.create_datamodule_fn_kwargs",
                     target=f"create_datamodule_fn {_describe_factory(self.create_datamodule_fn)}")
        if self.data_collate_fn is not None:
            raise InputError(
                f"LightningTrainerParam.data_collate_fn={self.data_collate_fn!r} applies to Ray "
                "datasets only, and this run's data comes from create_datamodule_fn. Fix: give "
                "the DataModule's DataLoader a collate_fn instead.")

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
