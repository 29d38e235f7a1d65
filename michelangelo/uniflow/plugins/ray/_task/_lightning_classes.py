"""A task body that gives Ray's Lightning classes to the other Lightning package's Trainer.

``ray.train.lightning`` builds its strategies, its cluster environment and ``prepare_trainer``
on ``lightning.pytorch`` whenever the ``lightning`` package can be imported, and on
``pytorch_lightning`` only where it cannot. On a machine with both packages, a hand-written Ray
Train loop that builds a ``pytorch_lightning.Trainer`` with Ray's classes therefore fails on
every worker, once they have started, with Lightning's "invalid strategy" error, which says
nothing of Ray. :func:`refuse_mixed_ray_lightning` reads the body's module in the process about
to run it and refuses that pairing before anything starts, naming both fixes. It imports
nothing: a module that uses Ray's classes has imported them already.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

from michelangelo.errors import InputError

__all__ = ["refuse_mixed_ray_lightning"]

# Ray's public Lightning names that a Trainer of the other package refuses or mishandles.
_RAY_NAMES = ("RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy",
              "RayLightningEnvironment", "RayTrainReportCallback", "prepare_trainer")


def _package(value: Any) -> str | None:
    """``"pytorch_lightning"`` or ``"lightning"`` for a module, class or function of either."""
    name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
    if not isinstance(name, str):
        return None
    for package in ("pytorch_lightning", "lightning"):
        if name == package or name.startswith(package + "."):
            return package
    return None


def _ray_builds_on(ray_pl: ModuleType) -> str | None:
    strategy = getattr(ray_pl, "RayDDPStrategy", None)
    if not isinstance(strategy, type):
        return None
    packages = {_package(base) for base in strategy.__mro__} - {None}
    return packages.pop() if len(packages) == 1 else None


def refuse_mixed_ray_lightning(fn: Any) -> None:
    """Refuse a body whose module trains on ``pytorch_lightning`` with Ray's ``lightning`` classes.

    Raises:
        InputError: The module imports Ray's Lightning classes, which Ray built on the
            ``lightning`` package here, and Lightning only from ``pytorch_lightning``.
    """
    ray_pl = sys.modules.get("ray.train.lightning")
    if ray_pl is None or _ray_builds_on(ray_pl) != "lightning":
        return
    namespace = getattr(inspect.unwrap(fn), "__globals__", None)
    if not isinstance(namespace, dict):
        return
    values = list(namespace.values())
    ray_objects = {id(getattr(ray_pl, name)): name for name in _RAY_NAMES if hasattr(ray_pl, name)}
    used = sorted({ray_objects[id(v)] for v in values if id(v) in ray_objects})
    if any(v is ray_pl for v in values):
        used.append("ray.train.lightning")
    packages = {_package(v) for v in values} - {None}
    if not used or packages != {"pytorch_lightning"}:
        return
    module = namespace.get("__file__") or namespace.get("__name__") or "the task's module"
    error = InputError(
        f"{module} (task {getattr(fn, '__qualname__', fn)!r}) trains with pytorch_lightning and "
        f"uses Ray's Lightning classes ({', '.join(used)}), but Ray built those on the "
        "`lightning` package, which is installed here too, so pytorch_lightning.Trainer would "
        "refuse them on every worker. Fix: write the module on `lightning` (import "
        "lightning.pytorch as pl), or keep pytorch_lightning and take the builds of Ray's "
        "classes on it: `from michelangelo.lib.trainer.torch.pytorch_lightning import "
        "ray_lightning`, then `ray_pl = ray_lightning('pytorch_lightning')` and use "
        "ray_pl.ddp(), ray_pl.environment() and ray_pl.prepare_trainer(trainer).")
    error.uniflow_retryable = False  # type: ignore[attr-defined]  # the same code fails again
    raise error
