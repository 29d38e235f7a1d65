"""Lineage recorded with a revision: where it was made, from what, with which packages."""

from __future__ import annotations

import contextlib
import getpass
import importlib.metadata
import math
import platform
from collections.abc import Mapping
from typing import Any

from michelangelo.errors import InputError

__all__ = ["clean_metrics", "collect_lineage", "package_versions", "user_name"]

_RESERVED = frozenset({"source", "uniflow", "checkpoint", "checkpoint_format", "training_run",
                       "datasets"})
_PACKAGES = ("torch", "pytorch-lightning", "ray", "safetensors", "numpy", "michelangelo")


def package_versions() -> dict[str, str]:
    """Versions of python and the packages that decide whether weights load the same way."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def user_name() -> str | None:
    """Who is registering (or moving an alias), for the record."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return None


def clean_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keep JSON scalars: numbers (0-d tensors and numpy scalars become floats) and strings.

    Raises:
        ValueError: A metric value is neither a number nor a string.
    """
    out: dict[str, Any] = {}
    for key, value in (metrics or {}).items():
        if hasattr(value, "item") and callable(value.item):
            with contextlib.suppress(ValueError, RuntimeError):  # not a 1-element tensor
                value = value.item()
        if isinstance(value, bool) or value is None or isinstance(value, str | int):
            out[str(key)] = value
        elif isinstance(value, float):
            out[str(key)] = value if math.isfinite(value) else str(value)
        else:
            raise InputError(f"metrics[{key!r}]={value!r} is not a number or a string. Fix: "
                             "pass scalar metrics (e.g. float(loss)).")
    return out


def _dataset_entry(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"name": name, "fingerprint": value}
    entry = {"name": name}
    for attr in ("fingerprint", "path", "num_rows", "format"):
        item = getattr(value, attr, None)
        if item is not None and not callable(item):
            entry[attr] = item if isinstance(item, int | float | str) else str(item)
    if len(entry) == 1:
        raise InputError(f"datasets[{name!r}]={value!r} is neither a DatasetVariable nor a "
                         "fingerprint string. Fix: pass the DatasetVariable the model was "
                         "trained on, or its fingerprint.")
    return entry


def collect_lineage(
    *,
    source: str,
    checkpoint: str | None,
    train_result: Mapping[str, Any] | None,
    datasets: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Gather the lineage of a registration.

    The uniflow run and task come from ``current_call()`` when registering inside a task;
    the training run path comes from the trainer's ``train()`` result when given; datasets
    are recorded with their fingerprints; ``extra`` keys (scalars) are added as they are.
    """
    from michelangelo.uniflow.core import current_call

    lineage: dict[str, Any] = {"source": source}
    call = current_call()
    if call is not None:
        lineage["uniflow"] = {"run_id": call.run_id, "task": call.task_name,
                              "call_id": call.call_id, "attempt": call.attempt,
                              "storage_url": call.storage.url}
    if checkpoint is not None:
        lineage["checkpoint"] = checkpoint
    if train_result:
        if train_result.get("path"):
            lineage["training_run"] = str(train_result["path"])
        if train_result.get("checkpoint_path") and "checkpoint" not in lineage:
            lineage["checkpoint"] = str(train_result["checkpoint_path"])
    if datasets:
        lineage["datasets"] = [_dataset_entry(str(k), v) for k, v in datasets.items()]
    for key, value in clean_metrics(extra).items():
        if key in lineage or key in _RESERVED:
            raise InputError(f"lineage[{key!r}] is set by the registry itself. Fix: use another "
                             f"key (reserved: {sorted(_RESERVED)}).")
        lineage[key] = value
    return lineage
