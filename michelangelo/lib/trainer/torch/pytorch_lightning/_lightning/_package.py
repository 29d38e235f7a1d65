"""Which Lightning package a user's object is built on: ``pytorch_lightning`` or ``lightning``.

Users write modules with either package (``import pytorch_lightning as pl`` or ``import
lightning as L``); a module built on one runs under that package's ``Trainer``. This module is
the one place that tells them apart. ``package_of`` names the package an object's class comes
from; ``load`` imports it; ``installed`` lists what this interpreter has.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from michelangelo.errors import InputError

__all__ = ["PACKAGES", "choose", "classes", "installed", "load", "package_of"]

# The two distributions' Trainer packages, in the order a tie is broken (the guide's first).
PACKAGES = ("pytorch_lightning", "lightning.pytorch")


def package_of(obj: object) -> str | None:
    """``"pytorch_lightning"`` or ``"lightning.pytorch"`` for an object whose class (or one of
    its bases) comes from that package; None for anything else (a plain object, a torch module).

    A class is judged by itself, an instance by its type.
    """
    kind = obj if isinstance(obj, type) else type(obj)
    for base in getattr(kind, "__mro__", (kind,)):
        module = getattr(base, "__module__", "") or ""
        for package in PACKAGES:
            if module == package or module.startswith(package + "."):
                return package
    return None


def installed() -> tuple[str, ...]:
    """The Lightning packages this interpreter can import, in ``PACKAGES`` order."""
    found = []
    for package in PACKAGES:
        try:
            if importlib.util.find_spec(package) is not None:
                found.append(package)
        except (ImportError, ValueError):  # a parent package missing, or a broken install
            continue
    return tuple(found)


def load(package: str) -> ModuleType:
    """Import ``package`` (one of ``PACKAGES``)."""
    if package not in PACKAGES:
        raise InputError(f"package={package!r} is not a Lightning package; "
                         f"use one of {PACKAGES}")
    return importlib.import_module(package)


def classes(path: str) -> tuple[type, ...]:
    """The class at ``path`` (``"callbacks.ModelCheckpoint"``) in every Lightning package this
    interpreter can import, for ``isinstance`` checks that hold for either."""
    found = []
    for package in installed():
        module_name, _, name = f"{package}.{path}".rpartition(".")
        found.append(getattr(importlib.import_module(module_name), name))
    return tuple(found)


def choose(module_package: str | None, *objects: tuple[str, object]) -> str:
    """The package a run trains with: the module's, checked against every Lightning object
    the user handed over (callbacks, loggers, strategy, plugins, profiler).

    Args:
        module_package: :func:`package_of` the user's module, or None when it is not known
            on the driver (then the objects, or the first installed package, decide).
        objects: ``(label, object)`` pairs, e.g. ``("lightning_trainer_kwargs['callbacks'][0]",
            cb)``.

    Raises:
        InputError: Objects of both packages, or of the other package than the module's.
    """
    chosen, source = module_package, "the LightningModule create_model_fn returns"
    for label, obj in objects:
        package = package_of(obj)
        if package is None:
            continue
        if chosen is None:
            chosen, source = package, label
        elif package != chosen:
            raise InputError(
                f"{label}={obj!r} is a {package} object, but {source} is built on {chosen}: "
                "one Trainer takes objects of one Lightning package only (pytorch_lightning "
                "and lightning.pytorch are separate copies of Lightning whose classes do not "
                f"mix). Fix: import it from {_import_of(chosen)}, like the rest of the run.")
    if chosen is None:
        found = installed()
        if not found:
            raise InputError("neither pytorch_lightning nor lightning is installed. Fix: "
                             "pip install 'michelangelo[trainer]' (pytorch_lightning) or "
                             "'michelangelo[trainer-lightning]' (lightning).")
        chosen = found[0]
    return chosen


def _import_of(package: str) -> str:
    return "lightning.pytorch (import lightning as L)" if package == "lightning.pytorch" \
        else "pytorch_lightning (import pytorch_lightning as pl)"
