"""Auto-resume, decided at construction (Ray Train V2 freezes the run context there).

Ray's native state always wins; the ``ExperimentStore`` is only a fallback when Ray has no
snapshot for ``<storage_path>/<name>``. Nothing here raises: a failed lookup is "start fresh".
"""

from __future__ import annotations

import logging
import posixpath
import re
from dataclasses import dataclass
from typing import Any

import fsspec

logger = logging.getLogger(__name__)

SNAPSHOT = "checkpoint_manager_snapshot.json"

# Ray Train V2 fills in both fields when they are not given: an unnamed run becomes
# "ray_train_run-<date>" (so it never resumes) and the storage path Ray's default.
_GENERATED_NAME = re.compile(r"^ray_train_run-\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}")

__all__ = ["ResumePlan", "experiment_dir_of", "plan_resume", "run_output_dir"]


@dataclass(frozen=True)
class ResumePlan:
    """What to resume from: Ray natively, a seed checkpoint, or nothing, and why."""

    native: bool
    seed_checkpoint: str | None
    reason: str


def experiment_dir_of(run_config: Any) -> str | None:
    """``<storage_path>/<name>`` of a run, or None when either is missing."""
    if not run_config.name or not run_config.storage_path:
        return None
    return posixpath.join(str(run_config.storage_path).rstrip("/"), run_config.name)


def as_storage_uri(path: str | None, run_config: Any) -> str | None:
    """A path Ray Train returned (a result's or a checkpoint's), as a URI of the run's storage.

    Ray gives those paths on its own filesystem object, so for ``storage_path="s3://b/p"``
    a checkpoint's path reads ``b/p/<name>/checkpoint_...``: without the scheme, neither the
    registry nor fsspec on another machine finds it. Local storage keeps its plain paths.
    """
    storage = str(run_config.storage_path or "")
    if path is None or "://" not in storage or "://" in path:
        return path
    scheme = storage.split("://", 1)[0]
    if scheme in ("file", "local"):
        return path
    return f"{scheme}://{path.lstrip('/')}"


def run_output_dir(run_config: Any, leaf: str) -> str:
    """``<storage_path>/<name>/<leaf>``: where a run keeps one kind of output (Ray's default
    storage when the run names none)."""
    from ray.train.constants import DEFAULT_STORAGE_PATH

    storage = str(run_config.storage_path or DEFAULT_STORAGE_PATH).rstrip("/")
    return posixpath.join(storage, str(run_config.name), leaf)


def missing_identity(run_config: Any) -> list[str]:
    """The run identity fields the user did not choose (Ray's generated values count as unset)."""
    from ray.train.constants import DEFAULT_STORAGE_PATH

    missing = []
    if not run_config.name or _GENERATED_NAME.match(str(run_config.name)):
        missing.append("name")
    if not run_config.storage_path or str(run_config.storage_path) == DEFAULT_STORAGE_PATH:
        missing.append("storage_path")
    return missing


def _exists(url: str) -> bool:
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return fs.exists(path)
    except Exception:  # noqa: BLE001 - unreadable means "no snapshot"
        return False


def plan_resume(run_config: Any, store: Any) -> ResumePlan:
    """Decide how this run resumes. Never raises."""
    experiment_dir = experiment_dir_of(run_config)
    missing = missing_identity(run_config)
    if experiment_dir is None or missing:
        plan = ResumePlan(False, None, f"auto-resume skipped: RunConfig has no {missing} "
                          "(Ray's generated defaults do not identify a run to resume)")
        logger.info(plan.reason)
        return plan
    if _exists(posixpath.join(experiment_dir, SNAPSHOT)):
        plan = ResumePlan(True, None, f"Ray resumes natively from {experiment_dir}")
        logger.info(plan.reason)
        return plan
    if store is None:
        return ResumePlan(False, None, "no Ray snapshot and no experiment_store: fresh run")
    try:
        previous = store.locate_resumable(run_config.storage_path, run_config.name)
        seed = _latest_checkpoint(previous) if previous else None
    except Exception as error:  # noqa: BLE001 - the protocol says never raise; be safe anyway
        logger.warning("experiment_store lookup failed (%s); starting fresh", error)
        previous, seed = None, None
    if seed is None:
        plan = ResumePlan(False, None, f"experiment_store has no checkpoint for "
                          f"({run_config.storage_path!r}, {run_config.name!r}): fresh run")
    else:
        plan = ResumePlan(False, seed, f"resuming from experiment_store checkpoint {seed} "
                          f"(experiment {previous})")
    logger.info(plan.reason)
    return plan


def _latest_checkpoint(experiment_dir: str) -> str | None:
    from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._experiment_store import (
        latest_checkpoint_dir,
    )

    return latest_checkpoint_dir(experiment_dir)
