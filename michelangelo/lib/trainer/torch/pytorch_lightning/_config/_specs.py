"""Spec metadata for warm starts: transfer learning and incremental training.

Both specs are resolved against the model registry (``michelangelo.lib.model_registry``) on
the driver: see the ``_warm_start`` package (``_plan``, ``_inherit``, ``_incremental``) for
what the trainer does with them. ``fused_model_submodule`` stays reserved and warns when set.
The public import path is ``michelangelo.lib.trainer.torch.pytorch_lightning.schema``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from michelangelo.errors import InputError

# ModelSpec names a registry model; it lives with the checkpoint readers in
# ``michelangelo.lib.checkpoints``, which the trainer and the registry both use.
from michelangelo.lib.checkpoints import ModelSpec

__all__ = [
    "IncrementalTrainingSpec",
    "LearningMode",
    "ModelSpec",
    "TransferLearningMetadata",
    "TransferLearningSpec",
]


class LearningMode(str, Enum):
    """How a run relates to an earlier model."""

    TRANSFER_LEARNING = "TRANSFER_LEARNING"
    """Start from a baseline model's layers, usually a different task."""
    INCREMENTAL_TRAINING = "INCREMENTAL_TRAINING"
    """Continue training the same model on new data."""


@dataclass(frozen=True)
class TransferLearningMetadata:
    """Where a warm-started run comes from.

    Args:
        learning_mode: Transfer learning or incremental training.
        baseline_model: The registry model the run starts from, if any.
    """

    learning_mode: LearningMode = LearningMode.TRANSFER_LEARNING
    baseline_model: ModelSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.learning_mode, LearningMode):
            try:
                object.__setattr__(self, "learning_mode", LearningMode(self.learning_mode))
            except ValueError:
                raise InputError(
                    f"TransferLearningMetadata.learning_mode={self.learning_mode!r} is not a "
                    f"LearningMode. Fix: use one of {[m.value for m in LearningMode]}."
                ) from None
        if self.baseline_model is not None and not isinstance(self.baseline_model, ModelSpec):
            raise InputError(
                f"TransferLearningMetadata.baseline_model must be a ModelSpec, got "
                f"{self.baseline_model!r}. Fix: ModelSpec(project_name=..., model_name=...)."
            )


def _names(owner: str, name: str, value: Any, *, regex: bool = False) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InputError(
            f"{owner}.{name} must be a list of strings, got {value!r}. "
            f"Fix: wrap it in a list, e.g. [{value!r}]."
        )
    out = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise InputError(f"{owner}.{name} holds {item!r}; every entry must be a non-empty "
                             "string. Fix: remove it or spell the layer name.")
        if regex:
            try:
                re.compile(item)
            except re.error as error:
                raise InputError(f"{owner}.{name} holds {item!r}, which is not a valid regular "
                                 f"expression ({error}). Fix: escape it or correct it.") from None
        out.append(item)
    return tuple(out)


def _check_metadata(owner: str, metadata: Any) -> None:
    if metadata is not None and not isinstance(metadata, TransferLearningMetadata):
        raise InputError(f"{owner}.metadata must be a TransferLearningMetadata, got "
                         f"{metadata!r}. Fix: TransferLearningMetadata(learning_mode=...).")


def _check_submodule(owner: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise InputError(f"{owner}.fused_model_submodule must be a string or None, got "
                         f"{value!r}. Fix: leave it unset; it is reserved.")
    if value is not None:
        warnings.warn(f"{owner}.fused_model_submodule={value!r} has no effect: the field is "
                      "reserved and nothing reads it. Fix: leave it unset.", UserWarning,
                      stacklevel=4)


@dataclass(frozen=True)
class TransferLearningSpec:
    """Inherit layers from a registered baseline, then freeze layers.

    With ``metadata.baseline_model`` set, the baseline revision (``ModelSpec`` with a
    number, ``"@alias"`` or None for the latest) is read from the model registry once and
    the inherited tensors are copied into every worker's fresh model; then freezing applies.
    Names and shapes are checked on the driver before any worker starts.

    Args:
        metadata: Learning mode and baseline model.
        layer_names_to_freeze: Parameter or module names (``"encoder"`` freezes every
            parameter under ``encoder.``) whose ``requires_grad`` is turned off.
        layer_names_to_freeze_regex: Regular expressions searched in parameter names.
        layer_names_to_inherit: Parameter/buffer or module names to copy from the baseline.
            Without any inherit name or pattern, every tensor the model and the baseline
            share is inherited.
        layer_names_to_inherit_regex: Regular expressions searched in those names.
        model_loader_function: ``fn(model, baseline_state_dict)`` called on every worker
            instead of the name-based copy (the baseline is still read once).
        fused_model_submodule: Reserved; has no effect (warns when set).
    """

    metadata: TransferLearningMetadata | None = None
    layer_names_to_freeze: Sequence[str] = field(default_factory=tuple)
    layer_names_to_freeze_regex: Sequence[str] = field(default_factory=tuple)
    layer_names_to_inherit: Sequence[str] = field(default_factory=tuple)
    layer_names_to_inherit_regex: Sequence[str] = field(default_factory=tuple)
    model_loader_function: Callable[..., Any] | None = None
    fused_model_submodule: str | None = None

    def __post_init__(self) -> None:
        owner = "TransferLearningSpec"
        _check_metadata(owner, self.metadata)
        for name in ("layer_names_to_freeze", "layer_names_to_inherit"):
            object.__setattr__(self, name, _names(owner, name, getattr(self, name)))
        for name in ("layer_names_to_freeze_regex", "layer_names_to_inherit_regex"):
            object.__setattr__(self, name, _names(owner, name, getattr(self, name), regex=True))
        if self.model_loader_function is not None and not callable(self.model_loader_function):
            raise InputError(f"{owner}.model_loader_function must be callable, got "
                             f"{self.model_loader_function!r}. Fix: pass a function or None.")
        _check_submodule(owner, self.fused_model_submodule)

    @property
    def freezes(self) -> bool:
        """Whether any freeze pattern is set."""
        return bool(self.layer_names_to_freeze or self.layer_names_to_freeze_regex)


@dataclass(frozen=True)
class IncrementalTrainingSpec:
    """Continue training a registered revision (``metadata.baseline_model``).

    The revision's weights start the run; the epoch counter starts where the revision's
    training ended (when it was registered with ``keep_optimizer_state=True``), so
    ``max_epochs`` counts all epochs as on a resume.

    Args:
        metadata: Learning mode and the revision to continue.
        load_optimizer_weights: Restore the revision's optimizer state too (it must have
            been registered with ``keep_optimizer_state=True``; strategy ``ddp``).
        override_incremental_training_epoch: Epoch number to start counting from instead.
        fused_model_submodule: Reserved; has no effect (warns when set).
    """

    metadata: TransferLearningMetadata | None = None
    load_optimizer_weights: bool = False
    override_incremental_training_epoch: int | None = None
    fused_model_submodule: str | None = None

    def __post_init__(self) -> None:
        owner = "IncrementalTrainingSpec"
        _check_metadata(owner, self.metadata)
        if not isinstance(self.load_optimizer_weights, bool):
            raise InputError(f"{owner}.load_optimizer_weights must be a bool, got "
                             f"{self.load_optimizer_weights!r}. Fix: True or False.")
        epoch = self.override_incremental_training_epoch
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)
                                  or epoch < 0):
            raise InputError(f"{owner}.override_incremental_training_epoch must be an int >= 0 "
                             f"or None, got {epoch!r}. Fix: pass an epoch number or None.")
        _check_submodule(owner, self.fused_model_submodule)
