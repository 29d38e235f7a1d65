"""Names of a package loaded on first use, so importing the package stays cheap.

A package whose public names live in modules that import heavy libraries (Lightning, Ray Train)
lists them in a table and hands it here::

    _LAZY = {"LightningTrainer": "_trainer", ...}   # name -> module of this package
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

The first access imports the module, takes the name and keeps it in the package's namespace,
so later accesses cost nothing; ``dir()`` lists the lazy names with the loaded ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: Mapping[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` for ``package``.

    Args:
        package: The package's ``__name__``.
        table: Public name -> the submodule of ``package`` that defines it.
        namespace: The package's ``globals()``, where a loaded name is kept.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
