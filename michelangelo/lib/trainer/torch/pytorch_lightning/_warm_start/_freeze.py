"""``TransferLearningSpec`` freezing: turn off ``requires_grad`` on the named layers."""

from __future__ import annotations

import re
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._config import TransferLearningSpec

__all__ = ["freeze_layers", "frozen_names"]


def _matches_name(param_name: str, layer: str) -> bool:
    return param_name == layer or param_name.startswith(layer + ".")


def frozen_names(names: list[str], spec: TransferLearningSpec) -> list[str]:
    """The parameter names ``spec`` freezes.

    Raises:
        ValueError: A name or pattern matches no parameter (a typo would otherwise leave
            the layer training without a sign).
    """
    selected: set[str] = set()
    unmatched: list[str] = []
    for layer in spec.layer_names_to_freeze:
        hits = [n for n in names if _matches_name(n, layer)]
        if not hits:
            unmatched.append(f"layer_names_to_freeze: {layer!r}")
        selected.update(hits)
    for pattern in spec.layer_names_to_freeze_regex:
        regex = re.compile(pattern)
        hits = [n for n in names if regex.search(n)]
        if not hits:
            unmatched.append(f"layer_names_to_freeze_regex: {pattern!r}")
        selected.update(hits)
    if unmatched:
        raise InputError(
            f"TransferLearningSpec patterns match no parameter of the model: {unmatched}. "
            f"The model's parameters include {names[:8]}. Fix: use those names (a module "
            "name freezes everything under it) or correct the regular expression."
        )
    return [n for n in names if n in selected]


def freeze_layers(model: Any, spec: TransferLearningSpec | None) -> list[str]:
    """Freeze the parameters ``spec`` names; returns their names."""
    if spec is None or not spec.freezes:
        return []
    params = dict(model.named_parameters())
    names = frozen_names(list(params), spec)
    for name in names:
        params[name].requires_grad_(False)
    return names
