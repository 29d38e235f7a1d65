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

__all__ = ["PACKAGES", "installed", "load", "package_of"]

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
