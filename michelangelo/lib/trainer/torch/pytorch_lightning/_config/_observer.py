"""``TrainingObserver``: structured training events for user code."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["TrainingObserver"]


@runtime_checkable
class TrainingObserver(Protocol):
    """Receives training events. Implementations must be picklable (they travel to workers).

    ``on_checkpoint_saved`` runs on every worker, so guard on rank or stay idempotent.
    """

    def on_result(self, metrics: dict[str, Any], checkpoint_path: str | None) -> None:
        """Called once on the driver after training finishes.

        Args:
            metrics: The final metrics of the run (those ``train()`` returns).
            checkpoint_path: The latest reported checkpoint, or None if none was reported.
        """
        ...

    def on_checkpoint_saved(
        self, epoch: int, step: int, metrics: dict[str, Any], checkpoint_path: str
    ) -> None:
        """Called on every worker after each checkpoint is reported to Ray Train.

        Args:
            epoch: The epoch the checkpoint was taken in.
            step: ``trainer.global_step`` (optimizer steps) at the checkpoint.
            metrics: The metrics reported with the checkpoint.
            checkpoint_path: Where the checkpoint is persisted (storage path / run / folder).
        """
        ...
