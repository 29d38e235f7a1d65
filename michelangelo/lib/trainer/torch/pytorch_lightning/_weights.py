"""``initial_weights_path``: read the state dict once on rank 0, broadcast it to the rest.

Reading on every worker would multiply storage traffic by the world size (and rate limits
on object stores with it); one read plus a collective broadcast keeps it at one.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from typing import Any

import fsspec

logger = logging.getLogger(__name__)

__all__ = ["check_weights_path", "copy_into", "load_initial_weights", "read_on_rank0",
           "read_state_dict"]


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
            raise ValueError(
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
        raise ValueError(
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
        raise ValueError(
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


def load_initial_weights(model: Any, path: str, rank: int, world_size: int) -> None:
    """Load ``path`` into ``model`` on every rank; only ``rank`` 0 touches storage.

    Rank 0 broadcasts either the state dict or its error, so a bad path fails every rank
    instead of leaving the others waiting in the collective.

    Raises:
        ValueError: The path cannot be read, or no key of the state dict matches the model.
    """
    status, value = read_on_rank0(lambda: read_state_dict(path), rank, world_size)
    if status == "error":
        raise ValueError(
            f"LightningTrainerParam.initial_weights_path={path!r} could not be read on rank 0: "
            f"{value}. Fix: check the path and the workers' access to it."
        )
    result = model.load_state_dict(value, strict=False)
    matched = len(value) - len(result.unexpected_keys)
    if value and matched == 0:
        raise ValueError(
            f"LightningTrainerParam.initial_weights_path={path!r}: none of its "
            f"{len(value)} keys (e.g. {sorted(value)[:3]}) match the model's parameters "
            f"(e.g. {sorted(model.state_dict())[:3]}). Fix: save the state dict of the same "
            "module class create_model_fn returns."
        )
    if rank == 0:
        logger.info(
            "Loaded initial weights from %s (strict=False): %d keys loaded, missing %s, "
            "unexpected %s", path, matched, list(result.missing_keys),
            list(result.unexpected_keys),
        )
