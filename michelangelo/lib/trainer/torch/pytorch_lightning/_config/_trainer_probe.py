"""The values of ``lightning_trainer_kwargs``, checked with Lightning's own rules on the driver.

The key names were checked against ``pytorch_lightning.Trainer``'s signature when the kwargs
were resolved; this module judges the values, in three steps:

1. types, against the annotations ``Trainer.__init__`` declares (``max_epochs="3"``,
   ``precision="17"``, a callback that is not a ``Callback``);
2. a few bounds Lightning documents but only meets inside its loops (``accumulate_grad_batches=0``
   and ``check_val_every_n_epoch=0`` are a modulo by zero mid-epoch), so ``Trainer.__init__``
   lets them through;
3. everything else Lightning validates in its constructor (ranges of ``max_epochs``/``max_steps``,
   ``val_check_interval``, ``limit_*_batches``, ``max_time``, ``gradient_clip_algorithm``,
   ``barebones`` conflicts, plugin types, ...): a real ``pytorch_lightning.Trainer`` is built
   here with the resolved kwargs. The parts that would start distributed machinery or touch
   devices are replaced (CPU, one device, ``strategy="auto"``; strategy, logger and profiler were
   resolved by us already), the root directory is a temporary folder, and the process-wide torch
   flags ``Trainer.__init__`` sets (deterministic algorithms, cuDNN benchmark) are put back.
   ``Trainer.__init__`` runs no callback hook and opens no logger, so nothing is written.
   When it refuses, the key to blame is found by building again with single keys.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
    TRAINER_DEFAULTS,
    ResolvedKwargs,
    trainer_parameters,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._param import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._config._signature_check import (
    closest,
    describe,
    matches,
)

logger = logging.getLogger(__name__)

__all__ = ["check_trainer_values"]

# Values this probe replaces; each is checked on its own below or owned by Ray Train.
_REPLACED = {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto"}

# Derived by the kwargs resolution, never the user's value.
_DERIVED = ("enable_checkpointing",)

# Lower bounds from Lightning's documentation that Trainer.__init__ does not enforce; the
# value first matters inside the fit loop, on the workers.
_LOOP_BOUNDS: dict[str, tuple[int, str]] = {
    "accumulate_grad_batches": (1, "the training loop takes the batch index modulo it"),
    "check_val_every_n_epoch": (1, "the training loop takes the epoch modulo it (None "
                                   "validates by val_check_interval instead)"),
    "log_every_n_steps": (0, "0 turns step logging off; below that every step logs"),
    "num_sanity_val_steps": (-1, "-1 runs all validation batches before training"),
    "min_epochs": (0, "it is a count of epochs"),
    "min_steps": (0, "it is a count of optimizer steps"),
}

_LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning.pytorch",
                      "lightning.fabric")


def check_trainer_values(param: LightningTrainerParam, resolved: ResolvedKwargs) -> None:
    """Raise ValueError naming the first ``lightning_trainer_kwargs`` value Lightning refuses."""
    labels = _labels(param)
    _check_types(resolved, labels)
    _check_accelerator(resolved.trainer_kwargs.get("accelerator"), resolved.package)
    _check_loop_bounds(resolved.trainer_kwargs, labels, resolved.package)
    _probe(resolved, labels)


def _labels(param: LightningTrainerParam) -> dict[str, str]:
    """The keys the user chose, each as the user wrote it."""
    labels = {key: f"lightning_trainer_kwargs[{key!r}]" for key in param.lightning_trainer_kwargs}
    if param.num_epochs_given and "max_epochs" not in labels:
        labels["max_epochs"] = "LightningTrainerParam.num_epochs"
    return labels


def _label(labels: dict[str, str], key: str) -> str:
    return labels.get(key, f"the trainer's default {key}")


def _default_of(key: str, package: str = "pytorch_lightning") -> Any:
    if key in TRAINER_DEFAULTS:
        return TRAINER_DEFAULTS[key]
    return trainer_parameters(package)[key].default


def _check_types(resolved: ResolvedKwargs, labels: dict[str, str]) -> None:
    params = trainer_parameters(resolved.package)
    items = [(k, v) for k, v in resolved.trainer_kwargs.items() if k not in _DERIVED]
    if resolved.logger.given and resolved.logger.name is None:
        items.append(("logger", resolved.logger.value))
    for key, value in items:
        annotation = params[key].annotation
        if matches(value, annotation):
            continue
        expected = describe(annotation)
        raise InputError(
            f"{_label(labels, key)}={value!r} is not accepted by {resolved.package}.Trainer, "
            f"which declares {key}: {expected}. Fix: pass a value of that type, or remove the "
            f"key to use the default {_default_of(key, resolved.package)!r}."
        )


def _check_accelerator(accelerator: Any, package: str) -> None:
    if not isinstance(accelerator, str):
        return  # an Accelerator instance (types were checked) or not given
    AcceleratorRegistry = importlib.import_module(f"{package}.accelerators").AcceleratorRegistry  # noqa: N806

    names = sorted({*AcceleratorRegistry.available_accelerators(), "auto", "gpu"})
    if accelerator not in names:
        suggestion = closest(accelerator, names)
        hint = f"did you mean {suggestion!r}? " if suggestion else ""
        raise InputError(
            f"lightning_trainer_kwargs['accelerator']={accelerator!r} is not an accelerator "
            f"Lightning knows; {hint}Fix: use one of {names}, or leave it unset (workers pick "
            "their device from ScalingConfig(use_gpu=...))."
        )


def _check_loop_bounds(kwargs: dict[str, Any], labels: dict[str, str], package: str) -> None:
    for key, (minimum, why) in _LOOP_BOUNDS.items():
        value = kwargs.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, int):
            continue
        if value < minimum:
            raise InputError(
                f"{_label(labels, key)}={value!r} must be an int >= {minimum} ({why}). "
                f"{package}.Trainer accepts it at construction and fails or misbehaves "
                f"only once training runs. Fix: pass an int >= {minimum}, or remove the key to "
                f"use the default {_default_of(key, package)!r}."
            )


def _probe_kwargs(resolved: ResolvedKwargs, root: str) -> dict[str, Any]:
    kwargs = {k: v for k, v in resolved.trainer_kwargs.items() if k not in _REPLACED}
    kwargs.update(_REPLACED)
    kwargs["default_root_dir"] = root
    # Our logger and profiler choices were validated when resolved; stand-ins that Lightning
    # builds without writing keep its barebones-mode conflicts visible.
    choice = resolved.logger
    kwargs["logger"] = bool(choice.given and (choice.name is not None
                                              or choice.value not in (None, False)))
    if resolved.profiler is not None:
        kwargs["profiler"] = "simple"
    return kwargs


def _probe(resolved: ResolvedKwargs, labels: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="michelangelo-trainer-probe-") as root, _contained():
        kwargs = _probe_kwargs(resolved, root)
        error = _build(kwargs, resolved.package)
        if error is None:
            return
        user_keys = [k for k in labels
                     if k in kwargs and k not in _REPLACED and k not in _DERIVED]
        blamed = _blame(kwargs, user_keys, error, resolved.package)
    if blamed is None:
        # Lightning refuses even the settings the user did not choose: an environment
        # problem on the driver, not the user's; the workers will tell.
        logger.debug("Trainer argument probe skipped: %s: %s", type(error).__name__, error)
        return
    key, error = blamed
    label = _label(labels, key)
    shown = resolved.trainer_kwargs.get(key, kwargs.get(key))
    if key == "logger":
        shown = resolved.logger.value if resolved.logger.name is None else resolved.logger.name
    message = " ".join(str(error).split())
    raise InputError(
        f"{label}={shown!r} is refused by {resolved.package}.Trainer ({type(error).__name__}: "
        f"{message}). Fix: change it as Lightning's message says, or remove the key to use "
        f"the default {_default_of(key, resolved.package)!r}."
    ) from None


def _blame(kwargs: dict[str, Any], user_keys: list[str], error: Exception,
           package: str) -> tuple[str, Exception] | None:
    """The user key whose value makes ``Trainer(**kwargs)`` fail, and Lightning's error."""
    base = {k: v for k, v in kwargs.items() if k not in user_keys}
    if _build(base, package) is not None:
        return None
    text = str(error)
    named = [k for k in user_keys if re.search(rf"\b{re.escape(k)}\b", text)]
    for key in named + [k for k in user_keys if k not in named]:
        single = _build({**base, key: kwargs[key]}, package)
        if single is not None:
            return key, single
    # Only a combination fails (e.g. barebones=True with a logger): blame the key whose
    # addition tips it over, in the order the user wrote them.
    current = dict(base)
    for key in user_keys:
        current[key] = kwargs[key]
        combined = _build(current, package)
        if combined is not None:
            return key, combined
    return None


def _build(kwargs: dict[str, Any], package: str) -> Exception | None:
    pl = importlib.import_module(package)
    # Lightning appends its own callbacks to the list it is given; keep the user's intact.
    fresh = {k: list(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    try:
        pl.Trainer(**fresh)
    except Exception as error:  # noqa: BLE001 - whatever Lightning raises is the verdict
        return error
    return None


@contextlib.contextmanager
def _contained() -> Iterator[None]:
    """Silence Lightning's banner and put back the torch flags Trainer.__init__ sets."""
    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
