"""Optimizer (and LR scheduler) states as safetensors + a JSON skeleton, without pickles.

A torch optimizer state dict is nested dicts and lists of numbers, strings and tensors.
Tensors go to a safetensors file under path-like names; the skeleton keeps everything else
and a ``{"__tensor__": name}`` placeholder where each tensor was. Integer dict keys (the
parameter ids under ``"state"``) are marked so they come back as ints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from michelangelo.errors import InputError

__all__ = ["split_states", "join_states"]

_INT_KEYS = "__int_keys__"


def _split(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu()
        return {"__tensor__": path}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        ints = all(isinstance(k, int) and not isinstance(k, bool) for k in value) and value
        for key, item in value.items():
            out[str(key)] = _split(item, f"{path}/{key}", tensors)
        if ints:
            out[_INT_KEYS] = True
        return out
    if isinstance(value, list | tuple):
        return [_split(item, f"{path}/{i}", tensors) for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": str(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise InputError(f"optimizer state entry {path!r} is a {type(value).__name__}, which the "
                     "registry cannot store without pickling. Fix: register without "
                     "keep_optimizer_state=True, or use a torch optimizer whose state holds "
                     "only tensors and numbers.")


def split_states(states: list[Mapping[str, Any]], prefix: str = "opt",
                 tensors: dict[str, torch.Tensor] | None = None
                 ) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Split a list of state dicts into ``(tensors, skeleton)``; tensor names start with
    ``prefix`` and are added to ``tensors`` when given (several lists, one file)."""
    tensors = {} if tensors is None else tensors
    skeleton = [_split(state, f"{prefix}{i}", tensors) for i, state in enumerate(states)]
    return tensors, skeleton


def _join(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return tensors[value["__tensor__"]]
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        ints = value.get(_INT_KEYS, False)
        return {(int(k) if ints else k): _join(v, tensors)
                for k, v in value.items() if k != _INT_KEYS}
    if isinstance(value, list):
        return [_join(item, tensors) for item in value]
    return value


def join_states(tensors: Mapping[str, torch.Tensor], skeleton: list[Any]) -> list[dict[str, Any]]:
    """Inverse of :func:`split_states`."""
    return [_join(state, tensors) for state in skeleton]
