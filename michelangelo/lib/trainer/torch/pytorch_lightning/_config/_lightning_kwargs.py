"""Turn ``lightning_trainer_kwargs`` into the ``pytorch_lightning.Trainer`` arguments we use.

A short pipeline of ``_choose_*`` steps, run once on the driver: every key is checked
against ``pytorch_lightning.Trainer``'s signature, siblings are split off, the trainer's own
defaults are filled in, ``enable_checkpointing`` is derived, and the
strategy, logger and profiler are resolved to things a worker can build.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._config._param import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._config._signature_check import check_kwargs
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import choose, classes, load
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import (
    StrategyChoice,
    choose_strategy,
)

logger = logging.getLogger(__name__)

# Differences from Lightning's defaults; each is an ordinary, overridable key.
TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": 1,
    "num_sanity_val_steps": 0,
    "enable_progress_bar": False,
}

SIBLING_KEYS = ("strategy_kwargs", "logger_kwargs", "profiler_kwargs")

# Keys whose values Ray Train decides; setting them would contradict the ScalingConfig.
_RAY_OWNED = {
    "devices": "ScalingConfig(num_workers=...)",
    "num_nodes": "ScalingConfig(num_workers=...)",
}

_PROFILERS = {
    "simple": "SimpleProfiler",
    "advanced": "AdvancedProfiler",
    "pytorch": "PyTorchProfiler",
}

_LOGGERS = {
    "csv": "CSVLogger",
    "tensorboard": "TensorBoardLogger",
    "mlflow": "MLFlowLogger",
    "comet": "CometLogger",
    "wandb": "WandbLogger",
}


@dataclass(frozen=True)
class ProfilerChoice:
    """A profiler given by name (built on the worker) or as an object."""

    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    instance: Any = None
    upload: bool = True
    package: str = "pytorch_lightning"

    def build(self, profiler_dir: str) -> Any:
        """The profiler for this worker, writing into ``profiler_dir``."""
        if self.instance is not None:
            if getattr(self.instance, "dirpath", None) is None:
                self.instance.dirpath = profiler_dir
            return self.instance
        profilers = importlib.import_module(f"{self.package}.profilers")
        kwargs = {"dirpath": profiler_dir, "filename": "profile", **self.kwargs}
        return getattr(profilers, _PROFILERS[self.name])(**kwargs)


@dataclass(frozen=True)
class LoggerChoice:
    """A logger given by name (built on the worker with ``logger_kwargs``) or passed through."""

    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    given: bool = False
    package: str = "pytorch_lightning"

    def build(self) -> Any:
        """The ``logger`` argument for the run's ``Trainer``."""
        if self.name is None:
            return self.value
        loggers = importlib.import_module(f"{self.package}.loggers")
        return getattr(loggers, _LOGGERS[self.name])(**self.kwargs)


@dataclass(frozen=True)
class ResolvedKwargs:
    """Everything the worker needs to build its ``Trainer``, and of which package."""

    trainer_kwargs: dict[str, Any]
    strategy: StrategyChoice
    logger: LoggerChoice
    profiler: ProfilerChoice | None
    # The run's Lightning package: the module's ("pytorch_lightning" or "lightning.pytorch").
    package: str = "pytorch_lightning"

    @property
    def accumulate_grad_batches(self) -> int:
        return int(self.trainer_kwargs.get("accumulate_grad_batches", 1))


def resolve_lightning_kwargs(param: LightningTrainerParam,
                             module_package: str | None = None,
                             datamodule: tuple[str, Any] | None = None) -> ResolvedKwargs:
    """Resolve ``param.lightning_trainer_kwargs`` on the driver.

    Args:
        param: The training run.
        module_package: The Lightning package of the module ``create_model_fn`` returns, when
            the driver could build it; the run trains with that package's ``Trainer``.
        datamodule: ``(label, class)`` of the run's DataModule when the driver knows it; it
            must be of the same package.

    Raises:
        ValueError: A key or sibling is invalid, or the objects mix the two Lightning
            packages; the message names it and the fix.
    """
    objects = _lightning_objects(param.lightning_trainer_kwargs)
    package = choose(module_package, *objects, *([datamodule] if datamodule else []))
    _check_names(param.lightning_trainer_kwargs, package)
    kwargs = dict(param.lightning_trainer_kwargs)
    siblings = {key: kwargs.pop(key, None) for key in SIBLING_KEYS}
    for key, owner in _RAY_OWNED.items():
        if key in kwargs:
            raise InputError(
                f"lightning_trainer_kwargs[{key!r}]={kwargs[key]!r} is decided by Ray Train "
                f"(one device per worker). Fix: remove it and set {owner} instead."
            )
    _choose_defaults(kwargs, param)
    _choose_checkpointing(kwargs)
    _choose_plugins(kwargs)
    strategy = choose_strategy(kwargs.pop("strategy", None), siblings["strategy_kwargs"],
                               package)
    logger_choice = dataclasses.replace(_choose_logger(kwargs, siblings["logger_kwargs"]),
                                        package=package)
    profiler = _choose_profiler(kwargs, siblings["profiler_kwargs"])
    if profiler is not None:
        profiler = dataclasses.replace(profiler, package=package)
    return ResolvedKwargs(kwargs, strategy, logger_choice, profiler, package)


def _lightning_objects(kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(label, object)`` for each object in the kwargs that may come from either Lightning
    package: the callbacks, the logger(s), the strategy, the plugins and the profiler."""
    found: list[tuple[str, Any]] = []
    for key in ("callbacks", "logger", "plugins"):
        value = kwargs.get(key)
        if isinstance(value, list | tuple):
            found += [(f"lightning_trainer_kwargs[{key!r}][{i}]", v) for i, v in enumerate(value)]
        elif value is not None:
            found.append((f"lightning_trainer_kwargs[{key!r}]", value))
    for key in ("strategy", "profiler"):
        if kwargs.get(key) is not None:
            found.append((f"lightning_trainer_kwargs[{key!r}]", kwargs[key]))
    return found


@functools.cache
def trainer_parameters(package: str = "pytorch_lightning") -> dict[str, inspect.Parameter]:
    """``Trainer.__init__``'s parameters (without ``self``) in ``package``, read once."""
    pl = load(package)
    params = dict(inspect.signature(pl.Trainer.__init__).parameters)
    params.pop("self", None)
    return params


def _check_names(kwargs: dict[str, Any], package: str) -> None:
    check_kwargs(load(package).Trainer, kwargs, label="lightning_trainer_kwargs",
                 target=f"{package}.Trainer", extra_names=SIBLING_KEYS)


def _choose_defaults(kwargs: dict[str, Any], param: LightningTrainerParam) -> None:
    if param.num_epochs_given:
        if "max_epochs" in kwargs:
            warnings.warn(
                f"Both num_epochs={param.num_epochs!r} and lightning_trainer_kwargs"
                f"['max_epochs']={kwargs['max_epochs']!r} are set; max_epochs wins. Fix: "
                "remove the deprecated num_epochs.",
                UserWarning,
                stacklevel=4,
            )
        else:
            kwargs["max_epochs"] = param.num_epochs
    _warn_epoch_default_caps(kwargs)
    for key, value in TRAINER_DEFAULTS.items():
        kwargs.setdefault(key, value)


def _warn_epoch_default_caps(kwargs: dict[str, Any]) -> None:
    """One warning when ``max_steps`` or ``max_time`` is set but ``max_epochs`` is not.

    Lightning's own default then trains until the step or time limit; the guide's default,
    ``max_epochs=1``, still applies here, and whichever limit comes first ends the run.
    """
    if "max_epochs" in kwargs:
        return
    limits = [f"{key}={kwargs[key]!r}" for key in ("max_steps", "max_time")
              if kwargs.get(key) not in (None, -1)]
    if not limits:
        return
    message = (
        f"lightning_trainer_kwargs sets {' and '.join(limits)} without max_epochs: "
        f"LightningTrainer's default max_epochs={TRAINER_DEFAULTS['max_epochs']} still applies, "
        "so the run ends after that epoch if it comes first. Fix: add "
        "lightning_trainer_kwargs['max_epochs']=-1 to stop on the step or time limit alone, "
        "or set max_epochs to the number of epochs you mean."
    )
    warnings.warn(message, UserWarning, stacklevel=5)
    logger.warning(message)


def has_model_checkpoint(callbacks: Any) -> bool:
    """Whether ``callbacks`` holds a ``ModelCheckpoint`` (of either Lightning package)."""
    model_checkpoint = classes("callbacks.ModelCheckpoint")
    return any(isinstance(cb, model_checkpoint) for cb in _as_list(callbacks))


def _as_list(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]


def _choose_checkpointing(kwargs: dict[str, Any]) -> None:
    callbacks = _as_list(kwargs.get("callbacks"))
    derived = has_model_checkpoint(callbacks)
    if "enable_checkpointing" in kwargs:
        given = kwargs.pop("enable_checkpointing")
        warnings.warn(
            f"lightning_trainer_kwargs['enable_checkpointing']={given!r} is ignored: it is "
            f"derived from the callbacks (a ModelCheckpoint is {'present' if derived else 'absent'}"
            f", so it is {derived}). Fix: remove the key; add a ModelCheckpoint callback to "
            "control Lightning checkpoints.",
            UserWarning,
            stacklevel=4,
        )
    kwargs["callbacks"] = callbacks
    kwargs["enable_checkpointing"] = derived


def _choose_plugins(kwargs: dict[str, Any]) -> None:
    # Lightning takes a plugin or a list of them; a tuple reads naturally too, so accept it.
    if isinstance(kwargs.get("plugins"), tuple):
        kwargs["plugins"] = list(kwargs["plugins"])


def _choose_logger(kwargs: dict[str, Any], logger_kwargs: Any) -> LoggerChoice:
    given = "logger" in kwargs
    value = kwargs.pop("logger", None)
    if logger_kwargs is not None and not isinstance(logger_kwargs, dict):
        raise InputError(
            f"lightning_trainer_kwargs['logger_kwargs'] must be a dict, got {logger_kwargs!r}. "
            "Fix: pass the logger's constructor arguments as a dict."
        )
    if isinstance(value, str):
        name = value.lower()
        if name not in _LOGGERS:
            raise InputError(
                f"lightning_trainer_kwargs['logger']={value!r} is not a known logger name. "
                f"Fix: use one of {sorted(_LOGGERS)} or pass a Logger instance."
            )
        return LoggerChoice(name=name, kwargs=dict(logger_kwargs or {}), given=True)
    if logger_kwargs:
        raise InputError(
            f"lightning_trainer_kwargs['logger_kwargs']={logger_kwargs!r} only applies when "
            f"'logger' is a name, but logger={value!r}. Fix: give the logger as one of "
            f"{sorted(_LOGGERS)}, or pass the arguments to your Logger's constructor."
        )
    return LoggerChoice(value=value, given=given)


def _choose_profiler(kwargs: dict[str, Any], profiler_kwargs: Any) -> ProfilerChoice | None:
    value = kwargs.pop("profiler", None)
    if profiler_kwargs is not None and not isinstance(profiler_kwargs, dict):
        raise InputError(
            f"lightning_trainer_kwargs['profiler_kwargs'] must be a dict, got "
            f"{profiler_kwargs!r}. Fix: pass the profiler's arguments as a dict."
        )
    extra = dict(profiler_kwargs or {})
    upload = extra.pop("upload_profiler_results", True)
    if not isinstance(upload, bool):
        raise InputError(
            f"profiler_kwargs['upload_profiler_results']={upload!r} must be a bool. "
            "Fix: True or False."
        )
    if value is None:
        return None
    if isinstance(value, str):
        name = value.lower()
        if name not in _PROFILERS:
            raise InputError(
                f"lightning_trainer_kwargs['profiler']={value!r} is not a known profiler. "
                f"Fix: use one of {sorted(_PROFILERS)} or pass a Profiler instance."
            )
        return ProfilerChoice(name=name, kwargs=extra, upload=upload)
    if not isinstance(value, classes("profilers.Profiler")):
        raise InputError(
            f"lightning_trainer_kwargs['profiler']={value!r} must be a name or a "
            "pytorch_lightning.profilers.Profiler (lightning.pytorch.profilers.Profiler in a "
            "lightning run). Fix: e.g. profiler='simple'."
        )
    if extra:
        raise InputError(
            f"profiler_kwargs={extra!r} cannot configure a Profiler instance. Fix: pass them "
            "to the profiler's constructor, or give the profiler by name."
        )
    return ProfilerChoice(instance=value, upload=upload)
