"""Where on a worker named-tensor work (warm starts, freezing) applies to the model.

A model has two shapes: as ``create_model_fn`` returns it, and after Lightning has called its
``configure_model()``, which may create layers (the FSDP2 pattern) or wrap and rename them
(LoRA adapters). Each step that names tensors applies at the first of the two where its names
fit, decided once on the driver from two meta-device builds:

* ``BEFORE``: right after ``create_model_fn`` (plain tensors; a LoRA model still has the
  baseline's names);
* ``AFTER``: right after ``configure_model()``, before the strategy wraps the model and the
  optimizers exist (under FSDP2 the tensors are already DTensor shards).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from michelangelo.errors import InternalError, MichelangeloError
from michelangelo.lib.trainer.torch.pytorch_lightning._config import build_meta_model
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback, package_of

__all__ = ["AFTER", "BEFORE", "ConfigureModelError", "MetaModels", "first_stage_that_fits", "has_configure_model",
           "run_after_configure", "stage_on_worker"]

BEFORE = "before_configure_model"
AFTER = "after_configure_model"

T = TypeVar("T")


def has_configure_model(model: Any) -> bool:
    """Whether ``model`` overrides ``LightningModule.configure_model`` (Lightning calls it)."""
    import importlib

    package = package_of(model) or "pytorch_lightning"
    helpers = importlib.import_module(f"{package}.utilities.model_helpers")
    return helpers.is_overridden("configure_model", model)


class MetaModels:
    """The user's model built on the meta device, before and after ``configure_model()``.

    Each is built at most once and only when asked for; either is None when the factory
    cannot be built on the driver (see ``build_meta_model``).
    """

    def __init__(self, create_model_fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._fn, self._kwargs = create_model_fn, kwargs

    @functools.cached_property
    def raw(self) -> Any | None:
        return build_meta_model(self._fn, self._kwargs, configure=False)

    @functools.cached_property
    def configured(self) -> Any | None:
        if self.raw is not None and not has_configure_model(self.raw):
            return self.raw
        return build_meta_model(self._fn, self._kwargs, configure=True)

    @property
    def configured_unknown(self) -> bool:
        """The factory built here but ``configure_model()`` could not run on the driver.

        The configured shape is then known only on the workers, so any decision about it
        (memory estimate, the stage a warm start or freeze applies at) is made there.
        """
        return (self.raw is not None and has_configure_model(self.raw)
                and self.configured is None)

    def stages(self) -> list[tuple[str, Any]]:
        """``(stage, model)`` for each distinct, buildable shape, ``BEFORE`` first."""
        out = [(BEFORE, self.raw)] if self.raw is not None else []
        if self.configured is not None and self.configured is not self.raw:
            out.append((AFTER, self.configured))
        return out


def first_stage_that_fits(models: MetaModels, check: Callable[[Any], T]
                          ) -> tuple[str, T] | None:
    """The first stage whose model ``check`` accepts, and what it returned.

    Returns:
        None when the model cannot be built on the driver, or when the model as the factory
        returns it does not fit and its ``configure_model()`` can only run on the workers
        (the workers decide).

    Raises:
        ValueError: No stage fits. The error is the one about the model as the factory
            returns it, unless that model has no tensors yet (everything is built in
            ``configure_model()``), in which case it is the configured model's.
    """
    errors: list[tuple[Any, ValueError]] = []
    for stage, model in models.stages():
        try:
            return stage, check(model)
        except ValueError as error:
            errors.append((model, error))
    if not errors or models.configured_unknown:
        return None
    model, error = errors[0]
    if len(errors) > 1 and not model.state_dict():
        error = errors[-1][1]
    raise error


def stage_on_worker(model: Any, check: Callable[[Any], object]) -> str:
    """The stage for a step the driver could not place, from this worker's model.

    ``BEFORE`` when ``check`` accepts the model as the factory returned it; otherwise ``AFTER``
    if the model has a ``configure_model()`` (its layers may appear there, where the step is
    checked again as it runs).

    Raises:
        ValueError: ``check``'s error, when the model has no ``configure_model()``.
    """
    try:
        check(model)
        return BEFORE
    except ValueError:
        if not has_configure_model(model):
            raise
        return AFTER


class ConfigureModelError(MichelangeloError, RuntimeError):
    """The user's ``configure_model()`` raised on a worker (the original is chained)."""


def run_after_configure(model: Any, action: Callable[[], None], rank: int = 0) -> Any | None:
    """Name the hook in its errors, and run ``action`` once right after it returns.

    A model without its own ``configure_model()`` is left alone (Lightning does not call
    the hook then); ``action`` must then have nothing to do.

    Returns:
        A Lightning callback that fails the fit if ``configure_model()`` never ran (so a
        planned step can never be skipped without a sign), or None for a model without the
        hook.
    """
    if not has_configure_model(model):
        return None
    original = model.configure_model
    state = {"done": False}
    owner = type(model).__qualname__

    @functools.wraps(original)
    def configure_model() -> None:
        try:
            original()
        except Exception as error:
            raise ConfigureModelError(
                f"{owner}.configure_model() raised {type(error).__name__}: {error} on worker "
                f"rank {rank}. Lightning calls this hook on every worker once the process "
                "group and device mesh exist. Fix: correct configure_model() (the chained "
                "traceback shows the line).") from error
        if not state["done"]:
            state["done"] = True
            action()

    model.configure_model = configure_model

    class AfterConfigureModel(Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            if not state["done"]:
                raise InternalError(
                    "A warm start or freeze planned for after configure_model() did not run: "
                    "Lightning never called configure_model() on this worker.")

    return AfterConfigureModel()
