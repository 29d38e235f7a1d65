"""``create_run_config``: Ray Train ``RunConfig`` defaults that follow the uniflow run."""

from __future__ import annotations

import posixpath
import uuid
from typing import Any

from ray.train import CheckpointConfig, FailureConfig, RunConfig

from michelangelo.uniflow.core.plugin import Storage, current_call


def create_run_config(
    name: str | None = None,
    storage_path: str | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    failure_config: FailureConfig | None = None,
    **kwargs: Any,
) -> RunConfig:
    """Build a Ray Train ``RunConfig`` whose results live with the uniflow run.

    Args:
        name: Run name; Ray Train resumes a run when ``storage_path``/``name`` are reused.
            Defaults to a name unique to this task call.
        storage_path: Where Ray Train writes results and checkpoints (any URL Ray accepts).
            Defaults to ``<storage root>/runs/<run id>/tasks/<call>/ray`` inside a task, or
            ``<storage root>/ray_results`` outside one.
        checkpoint_config: Passed through to ``RunConfig``.
        failure_config: Passed through to ``RunConfig``.
        **kwargs: Any other ``RunConfig`` argument.

    Returns:
        A ``ray.train.RunConfig``.
    """
    call = current_call()
    if storage_path is None:
        if call is not None:
            storage_path = call.storage.url_of(posixpath.join(call.call_dir, "ray"))
        else:
            storage = Storage()
            storage_path = storage.url_of(storage.join("ray_results"))
    if name is None:
        if call is not None:
            name = f"{call.run_id}-{call.call_id}"
        else:
            name = f"run-{uuid.uuid4().hex[:12]}"
    return RunConfig(
        name=name,
        storage_path=storage_path,
        checkpoint_config=checkpoint_config,
        failure_config=failure_config,
        **kwargs,
    )
