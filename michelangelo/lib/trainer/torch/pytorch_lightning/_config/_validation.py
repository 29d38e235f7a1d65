"""Driver-side checks that need more than one field: Trainer arguments, validation data,
pickling, precision, clipping.

They run in ``LightningTrainer.__init__``, before any Ray worker exists, so a mistake costs
a traceback instead of a worker group.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
    ResolvedKwargs,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._param import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._config._trainer_probe import (
    check_trainer_values,
)

# Everything that travels to the workers inside the loop config.
_SHIPPED_FIELDS = (
    "create_model_fn",
    "create_model_fn_kwargs",
    "create_datamodule_fn",
    "create_datamodule_fn_kwargs",
    "data_collate_fn",
    "training_observer",
    "experiment_store",
    "profiler_sink",
    "transfer_learning_spec",
)

_FP16 = {"16", "16-mixed", "16-true"}


def check_picklable(param: LightningTrainerParam, resolved: ResolvedKwargs) -> None:
    """Raise ValueError naming the first field Ray could not send to a worker."""
    import ray.cloudpickle as pickle

    items = [(f"LightningTrainerParam.{name}", getattr(param, name)) for name in _SHIPPED_FIELDS]
    items += [(f"lightning_trainer_kwargs[{k!r}]", v) for k, v in resolved.trainer_kwargs.items()]
    if resolved.strategy.instance is not None:
        items.append(("lightning_trainer_kwargs['strategy']", resolved.strategy.instance))
    if resolved.logger.value is not None:
        items.append(("lightning_trainer_kwargs['logger']", resolved.logger.value))
    if resolved.profiler is not None and resolved.profiler.instance is not None:
        items.append(("lightning_trainer_kwargs['profiler']", resolved.profiler.instance))
    for label, value in items:
        if value is None:
            continue
        try:
            pickle.dumps(value)
        except Exception as error:  # noqa: BLE001 - any pickling failure has the same fix
            raise InputError(
                f"{label}={value!r} cannot be pickled ({type(error).__name__}: {error}), so Ray "
                "cannot send it to the workers. Fix: define it at module level, keep locks, "
                "open files and clients out of it (create them lazily on the worker)."
            ) from None


def check_precision(resolved: ResolvedKwargs, scaling_config: Any) -> None:
    """fp16 needs a GPU; on CPU-only workers point at bf16 or use_gpu=True."""
    precision = resolved.trainer_kwargs.get("precision")
    if precision is None or scaling_config.use_gpu:
        return
    if str(precision) in _FP16:
        raise InputError(
            f"lightning_trainer_kwargs['precision']={precision!r} needs a GPU, but the "
            "ScalingConfig has use_gpu=False (CPU workers). Fix: use precision='bf16-mixed' "
            "(or 32) on CPU, or set ScalingConfig(use_gpu=True)."
        )


def check_clipping(resolved: ResolvedKwargs) -> None:
    """Norm clipping per FSDP shard is wrong; Lightning refuses it mid-run, we refuse it here.

    Holds for ``strategy="fsdp"`` and for an ``FSDPStrategy`` object of either Lightning
    package (Lightning's FSDP precision plugin is what refuses it).
    """
    kwargs = resolved.trainer_kwargs
    if kwargs.get("gradient_clip_val") in (None, 0, 0.0):
        return
    algorithm = kwargs.get("gradient_clip_algorithm") or "norm"
    if algorithm != "norm" or not _is_fsdp1(resolved.strategy):
        return
    given = "strategy='fsdp'" if resolved.strategy.instance is None else (
        f"strategy={type(resolved.strategy.instance).__name__}(...)")
    raise InputError(
        f"lightning_trainer_kwargs['gradient_clip_val']={kwargs['gradient_clip_val']!r} "
        f"with gradient_clip_algorithm='norm' is not supported under {given}: Lightning's "
        "FSDP precision plugin refuses it at the first optimizer step, because "
        "torch.nn.utils.clip_grad_norm_ over FSDP shards clips each shard by its own norm "
        "instead of the model's. Fix: set gradient_clip_algorithm='value', clip in the "
        "LightningModule's configure_gradient_clipping, or use strategy='ddp'."
    )


def _is_fsdp1(strategy: Any) -> bool:
    if strategy.instance is None:
        return strategy.name == "fsdp"
    bases = tuple(module.FSDPStrategy for module in (
        sys.modules.get(f"{package}.strategies") for package in ("pytorch_lightning",
                                                                 "lightning.pytorch"))
        if module is not None)
    return isinstance(strategy.instance, bases)


def check_val_data(param: LightningTrainerParam, resolved: ResolvedKwargs) -> None:
    """``val_data=None`` is allowed, as an explicit choice: say once what it turns off."""
    if param.val_data is not None:
        return
    callbacks = resolved.trainer_kwargs.get("callbacks") or []  # a list once resolved
    monitored = sorted({str(cb.monitor) for cb in callbacks if getattr(cb, "monitor", None)})
    also = (f" The callbacks monitor {monitored}: a metric that only validation_step logs will "
            "be missing and Lightning stops the run." if monitored else "")
    message = (
        "LightningTrainerParam.val_data=None: this run trains without validation (no "
        f"validation_step, no val_* metrics).{also} Fix: pass a validation ray.data.Dataset, "
        "or keep None if no validation is intended."
    )
    # One warning per trainer; uniflow copies warnings into the task log, so no log line too.
    warnings.warn(message, UserWarning, stacklevel=4)


def check_all(param: LightningTrainerParam, resolved: ResolvedKwargs, scaling_config: Any) -> None:
    """Run every cross-field check."""
    check_trainer_values(param, resolved)
    check_val_data(param, resolved)
    check_precision(resolved, scaling_config)
    check_clipping(resolved)
    check_picklable(param, resolved)
