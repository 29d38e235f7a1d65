"""``initial_weights_path``: read the state dict once on rank 0, broadcast it to the rest.

Reading on every worker would multiply storage traffic by the world size (and rate limits
on object stores with it); one read plus a collective broadcast keeps it at one.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import fsspec

from michelangelo.errors import InputError

logger = logging.getLogger(__name__)

__all__ = ["apply_initial_weights", "check_initial_weights_fit", "check_weights_path",
           "copy_into", "load_initial_weights", "local_state_dict_shapes", "read_initial_weights",
           "read_on_rank0", "read_state_dict"]


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def check_weights_path(path: str) -> None:
    """Fail on the driver when ``path`` certainly does not exist.

    Local paths are always checked. For URLs the filesystem is asked when it can answer
    (credentials may exist only on the workers, so an error asking is not a failure).

    Raises:
        ValueError: The path names nothing.
    """
    if _is_local(path):
        local = path[len("file://"):] if path.startswith("file://") else path
        if not os.path.isfile(os.path.expanduser(local)):
            raise InputError(
                f"LightningTrainerParam.initial_weights_path={path!r} does not exist (or is not "
                "a file). Fix: point it at a saved state dict (torch.save(model.state_dict()))."
            )
        return
    try:
        fs, fs_path = fsspec.core.url_to_fs(path)
        exists = fs.isfile(fs_path)
    except Exception as error:  # noqa: BLE001 - unknown protocol or no credentials here
        logger.debug("Cannot check initial_weights_path %r on the driver: %s", path, error)
        return
    if not exists:
        raise InputError(
            f"LightningTrainerParam.initial_weights_path={path!r} does not exist. Fix: check "
            "the URL (bucket, key, protocol) or upload the state dict there."
        )


def read_state_dict(path: str) -> dict[str, Any]:
    """Read a state dict (or a Lightning checkpoint holding one) from ``path``, once."""
    import torch

    with fsspec.open(os.path.expanduser(path) if _is_local(path) else path, "rb") as handle:
        data = handle.read()
    loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]  # a Lightning checkpoint
    if not isinstance(loaded, dict):
        raise InputError(
            f"LightningTrainerParam.initial_weights_path={path!r} holds a "
            f"{type(loaded).__name__}, not a state dict. Fix: save model.state_dict()."
        )
    return loaded


def copy_into(target: Any, source: Any) -> None:
    """Copy the full tensor ``source`` into ``target`` in place (a parameter or buffer).

    ``target`` may be an FSDP2 ``DTensor``: every rank holds the same full ``source``, so each
    cuts out its own shard locally (no communication).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    source = source.detach()
    if isinstance(target, DTensor):
        shard = distribute_tensor(source.to(device=target.device, dtype=target.dtype),
                                  target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(shard.to_local())
        return
    target.copy_(source.to(device=target.device, dtype=target.dtype))


def read_on_rank0(read: Callable[[], Any], rank: int, world_size: int) -> tuple[str, Any]:
    """Run ``read`` on rank 0 only and hand its result (or its error) to every rank.

    Storage is read once per run instead of once per worker; the error travels too, so a
    failed read fails every rank instead of leaving the others waiting in the collective.

    Returns:
        ``("ok", value)`` or ``("error", "ExceptionType: message")``, the same on all ranks.
    """
    import torch.distributed as dist

    payload: list[Any] = [None]
    if rank == 0:
        try:
            payload[0] = ("ok", read())
        except Exception as error:  # noqa: BLE001 - shipped to every rank below
            payload[0] = ("error", f"{type(error).__name__}: {error}")
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(payload, src=0)
    return payload[0]


def local_state_dict_shapes(path: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor shapes in a local weights file, read without loading the data; None if unknown.

    Only local files are read here (memory-mapped, with torch's restricted unpickler); for a
    URL, or a file in the legacy format, the workers decide alone.
    """
    import torch

    if not _is_local(path):
        return None
    local = os.path.expanduser(path[len("file://"):] if path.startswith("file://") else path)
    try:
        loaded = torch.load(local, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - the workers read it and say what is wrong
        logger.debug("initial_weights_path %r not read on the driver: %s", path, error)
        return None
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict):
        return None
    return {k: tuple(v.shape) for k, v in loaded.items() if hasattr(v, "shape")}


def check_initial_weights_fit(model: Any, stored: Mapping[str, Any], path: str) -> None:
    """Raise unless some key of ``stored`` names a tensor of ``model`` (the same on all sides).

    Raises:
        ValueError: No key matches the model's tensors.
    """
    own = model.state_dict()
    if stored and not any(key in own for key in stored):
        raise InputError(
            f"LightningTrainerParam.initial_weights_path={path!r}: none of its "
            f"{len(stored)} keys (e.g. {sorted(stored)[:3]}) match the model's parameters "
            f"(e.g. {sorted(own)[:3]}). Fix: save the state dict of the same "
            "module class create_model_fn returns."
        )


def read_initial_weights(path: str, rank: int, world_size: int) -> dict[str, Any]:
    """Read ``path`` on rank 0 and broadcast it, so a bad path fails every rank.

    Raises:
        ValueError: The path cannot be read.
    """
    status, value = read_on_rank0(lambda: read_state_dict(path), rank, world_size)
    if status == "error":
        raise InputError(
            f"LightningTrainerParam.initial_weights_path={path!r} could not be read on rank 0: "
            f"{value}. Fix: check the path and the workers' access to it."
        )
    return value


def apply_initial_weights(model: Any, weights: Mapping[str, Any], path: str, rank: int) -> None:
    """Copy every tensor of ``weights`` that names one of ``model``'s, in place.

    Like ``load_state_dict(strict=False)``, but the targets may be FSDP2 ``DTensor`` shards
    (weights applied after ``configure_model()``).

    Raises:
        ValueError: No key matches, or a matching key has another shape.
    """
    import torch

    check_initial_weights_fit(model, weights, path)
    own = model.state_dict()
    wrong = [f"{k}: model {list(own[k].shape)} vs file {list(v.shape)}"
             for k, v in weights.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    if wrong:
        raise InputError(
            f"LightningTrainerParam.initial_weights_path={path!r}: tensors of another shape "
            f"than the model's ({wrong[:3]}). Fix: save the state dict of a model built with "
            "the same create_model_fn_kwargs.")
    matched = [k for k in weights if k in own]
    with torch.no_grad():
        for key in matched:
            copy_into(own[key], weights[key])
    if rank == 0:
        logger.info(
            "Loaded initial weights from %s: %d keys loaded, missing %s, unexpected %s",
            path, len(matched), [k for k in own if k not in weights],
            [k for k in weights if k not in own])


def load_initial_weights(model: Any, path: str, rank: int, world_size: int) -> None:
    """Load ``path`` into ``model`` on every rank; only ``rank`` 0 touches storage.

    Raises:
        ValueError: The path cannot be read, or no key of the state dict matches the model.
    """
    apply_initial_weights(model, read_initial_weights(path, rank, world_size), path, rank)
