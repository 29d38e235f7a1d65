"""Checkpoint formats written by the trainer's strategies, read back as plain state dicts.

Each strategy leaves ``checkpoint.ckpt`` inside the reported Ray checkpoint directory, but what
that name points at differs:

===================  =========================================================================
Format               What ``checkpoint.ckpt`` is
===================  =========================================================================
``FULL_FILE``        one ``torch.save`` file with a ``"state_dict"`` entry (ddp, fsdp "full")
``FSDP2_DCP``        a ``torch.distributed.checkpoint`` folder whose tensors live under
                     ``state_dict.*`` plus a ``meta.pt`` with loop state (fsdp2)
``FSDP_SHARDED``     a DCP folder with the tensors under ``model.*`` (fsdp, ``"sharded"``)
``DEEPSPEED_ZERO``   a DeepSpeed folder: a ``latest`` tag file and a tag folder of ZeRO shards
===================  =========================================================================

The loaders are small pure functions ``(local path) -> state dict`` of plain CPU tensors. Every
loader returns the keys of the *LightningModule* (``net.0.weight`` for ``self.net``): the
DeepSpeed loader removes the ``_forward_module.`` wrapper prefix DeepSpeed adds, the others
have none to remove. Fitting those keys to a model that is only the inner module is
:func:`align_state_dict_keys`'s job.

No loader needs a process group; DCP folders are read with ``no_dist=True``. Remote
checkpoints (an fsspec URL or a ``ray.train.Checkpoint``) are first copied into a temporary
directory by :func:`local_checkpoint`.
"""

from __future__ import annotations

import contextlib
import enum
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from michelangelo.errors import InputError

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointFormat",
    "align_state_dict_keys",
    "detect_format",
    "expected_formats",
    "load_deepspeed_zero",
    "load_fsdp2_dcp",
    "load_fsdp_sharded",
    "load_full_file",
    "load_state_dict",
    "local_checkpoint",
    "resolve_checkpoint_entry",
]

#: Name the trainer gives the Lightning checkpoint inside each reported Ray checkpoint folder.
CHECKPOINT_NAME = "checkpoint.ckpt"

_DCP_METADATA = ".metadata"
_DEEPSPEED_WRAPPER_PREFIX = "_forward_module."


class CheckpointFormat(str, enum.Enum):
    """On-disk shapes of a Lightning checkpoint, one per family of strategies."""

    FULL_FILE = "single file (ddp, or fsdp with state_dict_type='full')"
    FSDP2_DCP = "FSDP2 distributed checkpoint folder (fsdp2)"
    FSDP_SHARDED = "FSDP sharded checkpoint folder (fsdp with state_dict_type='sharded')"
    DEEPSPEED_ZERO = "DeepSpeed ZeRO checkpoint folder (deepspeed)"


# --------------------------------------------------------------------------------------------
# Locating the checkpoint
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def local_checkpoint(source: str | os.PathLike[str] | Any) -> Iterator[Path]:
    """Yield a local path for ``source``, downloading it first when it is remote.

    Args:
        source: A local path, a ``file://`` URL, any other fsspec URL (``s3://``, ``gs://``,
            ``memory://`` ...), or a ``ray.train.Checkpoint``.

    Yields:
        A local path. Downloaded copies live in a temporary directory removed on exit.

    Raises:
        FileNotFoundError: If ``source`` does not exist.
    """
    if hasattr(source, "as_directory") and hasattr(source, "filesystem"):
        # A ray.train.Checkpoint: it knows its own filesystem and downloads when remote.
        with source.as_directory() as directory:
            yield Path(directory)
        return

    text = os.fspath(source)
    if "://" not in text or text.startswith("file://"):
        local = Path(text.removeprefix("file://"))
        if not local.exists():
            raise FileNotFoundError(f"Checkpoint path {text!r} does not exist.")
        yield local
        return

    import fsspec

    fs, remote_path = fsspec.core.url_to_fs(text)
    if not fs.exists(remote_path):
        raise FileNotFoundError(f"Checkpoint URL {text!r} does not exist.")
    with tempfile.TemporaryDirectory(prefix="michelangelo-ckpt-") as tmp:
        target = Path(tmp) / Path(remote_path.rstrip("/")).name
        if fs.isdir(remote_path):
            fs.get(remote_path.rstrip("/") + "/", str(target), recursive=True)
        else:
            fs.get(remote_path, str(target))
        yield target


def resolve_checkpoint_entry(path: Path) -> Path:
    """Return the Lightning checkpoint inside a reported Ray checkpoint folder.

    A folder holding ``checkpoint.ckpt`` (the trainer's layout) resolves to that entry, file or
    folder; anything else is returned unchanged so a bare Lightning checkpoint works too.
    """
    entry = path / CHECKPOINT_NAME
    return entry if path.is_dir() and entry.exists() else path


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def _dcp_top_level_keys(path: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def _is_deepspeed_folder(path: Path) -> bool:
    if (path / "latest").is_file():
        return True
    return any(path.glob("*/mp_rank_*_model_states.pt")) or any(
        path.glob("*/zero_pp_rank_*_optim_states.pt")
    )


def detect_format(path: Path) -> CheckpointFormat:
    """Tell the format of a local Lightning checkpoint from its contents.

    Args:
        path: The checkpoint itself (``.../checkpoint.ckpt``), not the Ray folder around it;
            see :func:`resolve_checkpoint_entry`.

    Returns:
        The detected :class:`CheckpointFormat`.

    Raises:
        ValueError: If the contents match no known format.
    """
    if path.is_file():
        return CheckpointFormat.FULL_FILE
    if path.is_dir():
        if (path / _DCP_METADATA).is_file():
            top = _dcp_top_level_keys(path)
            if "state_dict" in top:
                return CheckpointFormat.FSDP2_DCP
            if "model" in top:
                return CheckpointFormat.FSDP_SHARDED
            raise InputError(
                f"Checkpoint folder {str(path)!r} is a torch.distributed.checkpoint folder, but its "
                f"top-level entries {sorted(top)} contain neither 'state_dict' (fsdp2) nor 'model' "
                "(fsdp sharded). Point at a checkpoint written by the trainer."
            )
        if _is_deepspeed_folder(path):
            return CheckpointFormat.DEEPSPEED_ZERO
    listing = sorted(p.name for p in path.iterdir())[:10] if path.is_dir() else []
    raise InputError(
        f"Cannot tell the format of checkpoint {str(path)!r} (contents: {listing}). Expected a "
        f"single file, a DCP folder with {_DCP_METADATA!r}, or a DeepSpeed folder with 'latest'."
    )


def _strategy_name(strategy: Any) -> str:
    return strategy if isinstance(strategy, str) else type(strategy).__name__


def expected_formats(strategy: Any) -> frozenset[CheckpointFormat] | None:
    """Formats a strategy can write, or ``None`` when the strategy is not one we know.

    Args:
        strategy: ``lightning_trainer_kwargs["strategy"]``: ``None``, one of ``"ddp"``,
            ``"fsdp"``, ``"fsdp2"``, ``"deepspeed"``, or a Lightning ``Strategy`` instance.

    Raises:
        ValueError: For a strategy string the trainer does not accept.
    """
    if strategy is None or isinstance(strategy, str):
        by_name = {
            None: {CheckpointFormat.FULL_FILE},
            "ddp": {CheckpointFormat.FULL_FILE},
            # Lightning's FSDP default is state_dict_type="full"; "sharded" is a strategy_kwarg.
            "fsdp": {CheckpointFormat.FULL_FILE, CheckpointFormat.FSDP_SHARDED},
            "fsdp2": {CheckpointFormat.FSDP2_DCP},
            "deepspeed": {CheckpointFormat.DEEPSPEED_ZERO},
        }
        # The trainer accepts names in any case; so must the loader.
        name = strategy.lower() if isinstance(strategy, str) else strategy
        if name not in by_name:
            raise InputError(
                f"lightning_trainer_kwargs['strategy']={strategy!r} is not a strategy the trainer "
                "knows. Use None, 'ddp', 'fsdp', 'fsdp2', 'deepspeed' or a Strategy instance."
            )
        return frozenset(by_name[name])

    # Most specific classes first: DeepSpeedStrategy subclasses DDPStrategy.
    if _is_a(strategy, "DeepSpeedStrategy"):
        return frozenset({CheckpointFormat.DEEPSPEED_ZERO})
    if _is_a(strategy, "ModelParallelStrategy"):
        if getattr(strategy, "_save_distributed_checkpoint", True):
            return frozenset({CheckpointFormat.FSDP2_DCP})
        return frozenset({CheckpointFormat.FULL_FILE})
    if _is_a(strategy, "FSDPStrategy"):
        sharded = getattr(strategy, "_state_dict_type", "full") == "sharded"
        return frozenset(
            {CheckpointFormat.FSDP_SHARDED if sharded else CheckpointFormat.FULL_FILE}
        )
    if _is_a(strategy, "DDPStrategy") or _is_a(strategy, "SingleDeviceStrategy"):
        return frozenset({CheckpointFormat.FULL_FILE})
    return None


# --------------------------------------------------------------------------------------------
# Loaders: (local path) -> LightningModule state dict of plain CPU tensors
# --------------------------------------------------------------------------------------------


def load_full_file(path: Path) -> dict[str, torch.Tensor]:
    """Read a single-file Lightning checkpoint (ddp, fsdp ``"full"``) without running code.

    Lightning's checkpoints (weights, loop and callback state, plain hyperparameters) load
    with torch's restricted unpickler. Objects it does not know (a custom class among the
    hyperparameters) are refused by name; the user allows them with torch's own allow-list.

    Raises:
        ValueError: The file holds objects outside the allow-list, or is not a Lightning
            checkpoint.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001 - the names are a courtesy; the refusal stands
            names = []
        raise InputError(
            f"{str(path)!r} holds pickled objects that torch's safe loader does not allow "
            f"({', '.join(names) or str(error)[:300]}), so it was not loaded. Fix: if you "
            "trust the checkpoint, allow those classes before loading with "
            "torch.serialization.add_safe_globals([...]); or keep such objects out of "
            "save_hyperparameters()."
        ) from error
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        keys = sorted(checkpoint)[:10] if isinstance(checkpoint, Mapping) else type(checkpoint)
        raise InputError(
            f"{str(path)!r} is not a Lightning checkpoint: no 'state_dict' entry (found {keys}). "
            "For a bare state dict, call model.load_state_dict(torch.load(path)) directly."
        )
    return dict(checkpoint["state_dict"])


def _load_dcp_entry(path: Path, entry: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    # This is the reader behind torch's own ``format_utils.dcp_to_torch_save``: the planner
    # rebuilds the saved structure from the metadata, so no model and no process group are
    # needed, and ``keys`` skips the optimizer shards (often twice the size of the weights).
    # The public ``dcp.load`` returns early on an empty target dict, hence the private entry.
    loaded: dict[str, Any] = {}
    _load_state_dict(
        loaded,
        storage_reader=FileSystemReader(str(path)),
        planner=_EmptyStateDictLoadPlanner(keys={entry}),
        no_dist=True,
    )
    if entry not in loaded:
        raise InputError(
            f"DCP checkpoint {str(path)!r} has no {entry!r} entry; it was not written by the "
            "strategy this loader expects."
        )
    return {key: _plain(value) for key, value in loaded[entry].items()}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and hasattr(value, "full_tensor"):
        return value.full_tensor().cpu()
    return value.cpu() if isinstance(value, torch.Tensor) else value


def load_fsdp2_dcp(path: Path) -> dict[str, torch.Tensor]:
    """Read an FSDP2 (``ModelParallelStrategy``) DCP folder; weights are under ``state_dict``."""
    return _load_dcp_entry(path, "state_dict")


def load_fsdp_sharded(path: Path) -> dict[str, torch.Tensor]:
    """Read an FSDP1 ``state_dict_type="sharded"`` DCP folder; weights are under ``model``."""
    return _load_dcp_entry(path, "model")


def load_deepspeed_zero(path: Path) -> dict[str, torch.Tensor]:
    """Merge a DeepSpeed ZeRO-2/3 checkpoint folder into one fp32 state dict.

    DeepSpeed names parameters after its engine's module, Lightning's wrapper, so every key
    starts with ``_forward_module.``; that prefix is removed to give LightningModule keys.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint(str(path))
    return {
        key.removeprefix(_DEEPSPEED_WRAPPER_PREFIX): _plain(value)
        for key, value in state_dict.items()
    }


_LOADERS: dict[CheckpointFormat, Callable[[Path], dict[str, torch.Tensor]]] = {
    CheckpointFormat.FULL_FILE: load_full_file,
    CheckpointFormat.FSDP2_DCP: load_fsdp2_dcp,
    CheckpointFormat.FSDP_SHARDED: load_fsdp_sharded,
    CheckpointFormat.DEEPSPEED_ZERO: load_deepspeed_zero,
}


def load_state_dict(source: str | os.PathLike[str] | Any, strategy: Any = None) -> dict[str, Any]:
    """Load the LightningModule weights of a trainer checkpoint, whatever the strategy.

    Args:
        source: The reported Ray checkpoint folder (holding ``checkpoint.ckpt``) or the
            Lightning checkpoint itself; local, ``file://``, any fsspec URL or a
            ``ray.train.Checkpoint``.
        strategy: The strategy the run trained with (see :func:`expected_formats`). The
            detected format must be one it writes; ``None`` means ``"ddp"``.

    Returns:
        A state dict of plain CPU tensors keyed like the LightningModule.

    Raises:
        ValueError: If the checkpoint's format is not one ``strategy`` writes, or unknown.
        FileNotFoundError: If ``source`` does not exist.
    """
    allowed = expected_formats(strategy)
    with local_checkpoint(source) as local:
        entry = resolve_checkpoint_entry(local)
        found = detect_format(entry)
        if allowed is not None and found not in allowed:
            wanted = " or ".join(sorted(f.value for f in allowed))
            raise InputError(
                f"Checkpoint {str(source)!r} is a {found.value}, but strategy="
                f"{_strategy_name(strategy)!r} writes a {wanted}. Set "
                "lightning_trainer_kwargs['strategy'] to the strategy the run trained with."
            )
        return _LOADERS[found](entry)


# --------------------------------------------------------------------------------------------
# Key alignment
# --------------------------------------------------------------------------------------------


def _dotted_prefixes(key: str) -> Iterable[str]:
    parts = key.split(".")
    for depth in range(1, len(parts)):
        yield ".".join(parts[:depth]) + "."


def align_state_dict_keys(
    state_dict: Mapping[str, Any], target_keys: Iterable[str]
) -> tuple[dict[str, Any], str]:
    """Rename checkpoint keys so they line up with a target model's keys.

    The rule, in order:

    1. **Exact keys.** If the checkpoint's keys already match at least as many target keys as
       any stripped variant would, they are used unchanged (the target is the
       LightningModule, or a model with the same attribute names).
    2. **One common leading prefix removed.** Otherwise the dotted prefix (``"net."``,
       ``"model.encoder."`` ...) whose removal matches the most target keys is stripped from
       every key that has it; keys without it are kept as they are, so they surface as
       unexpected keys instead of vanishing. This covers a target that is the module the
       LightningModule holds as an attribute (``self.net``).

    Args:
        state_dict: Checkpoint keys and values, as the loaders return them.
        target_keys: ``model.state_dict().keys()`` of the model to fill.

    Returns:
        ``(aligned_state_dict, removed_prefix)``; ``removed_prefix`` is ``""`` for rule 1.
    """
    targets = set(target_keys)
    best_prefix, best_hits = "", sum(key in targets for key in state_dict)
    counts: dict[str, int] = {}
    for key in state_dict:
        for prefix in _dotted_prefixes(key):
            if key[len(prefix) :] in targets:
                counts[prefix] = counts.get(prefix, 0) + 1
    for prefix, hits in sorted(counts.items()):
        if hits > best_hits:
            best_prefix, best_hits = prefix, hits
    if not best_prefix:
        return dict(state_dict), ""
    return {key.removeprefix(best_prefix): value for key, value in state_dict.items()}, best_prefix


def _is_a(strategy: Any, name: str) -> bool:
    """Whether ``strategy`` is a Lightning ``strategies.<name>`` of either package that is
    loaded (a strategy object's own package always is)."""
    for package in ("pytorch_lightning", "lightning.pytorch"):
        module = sys.modules.get(f"{package}.strategies")
        if module is not None and isinstance(strategy, getattr(module, name)):
            return True
    return False
