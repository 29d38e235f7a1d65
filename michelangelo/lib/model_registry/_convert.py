"""Weights (and optionally optimizer state) from any checkpoint the trainer writes.

The format is detected and read by the trainer's own loaders
(``michelangelo.lib.checkpoints``), so there is one reader per format in the code base. The
optimizer state is kept only for single-file checkpoints (ddp), the format whose optimizer
state belongs to the whole model rather than to one shard.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import (
    CheckpointFormat,
    detect_format,
    load_state_dict,
    local_checkpoint,
    resolve_checkpoint_entry,
)

__all__ = ["TrainingState", "read_checkpoint"]

# The strategy whose expected formats include each detected format: passing it to the
# trainer's load_state_dict selects that format's loader and nothing else.
_STRATEGY_FOR = {
    CheckpointFormat.FULL_FILE: "ddp",
    CheckpointFormat.FSDP2_DCP: "fsdp2",
    CheckpointFormat.FSDP_SHARDED: "fsdp",
    CheckpointFormat.DEEPSPEED_ZERO: "deepspeed",
}


@dataclasses.dataclass
class TrainingState:
    """Optimizer states and the loop position of a checkpoint or of a registered revision.

    ``lr_scheduler_states`` is None where a revision kept no scheduler state (one registered
    before they were kept); read from a checkpoint it is always a list.
    """

    optimizer_states: list[dict[str, Any]]
    epoch: int
    global_step: int
    lr_scheduler_states: list[dict[str, Any]] | None = None


def _completed_epochs(checkpoint: dict[str, Any]) -> int:
    # The trainer checkpoints at epoch end, inside on_train_epoch_end, where Lightning has
    # counted the epoch as processed but not yet completed; "processed" is the number to
    # continue from. Older or hand-made checkpoints only have "epoch" (0-based, current).
    try:
        return int(checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])
    except (KeyError, TypeError):
        return int(checkpoint.get("epoch", -1)) + 1


def _training_state(entry: str) -> TrainingState:
    try:
        checkpoint = torch.load(entry, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - weights_only refuses unknown pickled objects
        raise InputError(
            f"keep_optimizer_state=True: checkpoint {entry!r} holds objects that torch.load("
            f"weights_only=True) refuses ({type(error).__name__}: {str(error)[:300]}), and the "
            "registry never unpickles arbitrary objects. Fix: keep only tensors and plain values "
            "in the LightningModule's hyperparameters, or register without optimizer state."
        ) from None
    states = checkpoint.get("optimizer_states")
    if not states:
        raise InputError(f"keep_optimizer_state=True: checkpoint {entry!r} has no optimizer "
                         "state. Fix: register from a checkpoint written during training.")
    return TrainingState(list(states), _completed_epochs(checkpoint),
                         int(checkpoint.get("global_step", 0)),
                         list(checkpoint.get("lr_schedulers") or []))


def read_checkpoint(source: Any, keep_optimizer_state: bool
                    ) -> tuple[dict[str, torch.Tensor], TrainingState | None, str]:
    """Read a trainer checkpoint of any format.

    Args:
        source: A Ray checkpoint folder (holding ``checkpoint.ckpt``), the Lightning
            checkpoint itself, a ``ray.train.Checkpoint``; local or any fsspec URL.
        keep_optimizer_state: Also read the optimizer state and loop position.

    Returns:
        ``(state_dict, training_state or None, format description)``.

    Raises:
        ValueError: Unknown format, or optimizer state asked for a sharded format.
        FileNotFoundError: ``source`` does not exist.
    """
    with local_checkpoint(source) as local:
        entry = resolve_checkpoint_entry(local)
        found = detect_format(entry)
        if keep_optimizer_state and found is not CheckpointFormat.FULL_FILE:
            raise InputError(
                f"keep_optimizer_state=True needs a single-file checkpoint (ddp), but "
                f"{str(source)!r} is a {found.value}, whose optimizer state is sharded per "
                "worker. Fix: register its weights without keep_optimizer_state."
            )
        state_dict = load_state_dict(local, _STRATEGY_FOR[found])
        training = _training_state(os.fspath(entry)) if keep_optimizer_state else None
    return state_dict, training, found.value
