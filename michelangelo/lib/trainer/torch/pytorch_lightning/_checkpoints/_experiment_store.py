"""Where a run's experiment directory is remembered, so a later run can resume from it.

Ray Train V2 resumes natively when a run reuses its ``storage_path``/``name``; the store is the
fallback used when Ray's own snapshot is gone (for example, the run directory was copied, or the
snapshot file was lost while the checkpoints survived). It is deliberately forgiving: any failure
is logged and read as "nothing to resume", because a bookkeeping problem must never fail training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import fsspec
from fsspec.implementations.local import LocalFileSystem

from michelangelo.errors import InputError
from michelangelo.uniflow.core.plugin import storage_url

logger = logging.getLogger(__name__)

CHECKPOINT_DIR_PREFIX = "checkpoint_"
CHECKPOINT_FILE_NAME = "checkpoint.ckpt"
_RECORD_VERSION = 1
_STORE_SUBDIR = "experiment_store"

# Ray Train V2 names checkpoint folders by local time with microseconds; Ray Train V1 (and Tune)
# by a zero-padded index. Both sort lexically in the order they were written within one run.
_V2_NAME = re.compile(r"^checkpoint_(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}\.\d{6})$")
_V1_NAME = re.compile(r"^checkpoint_(\d+)$")


@runtime_checkable
class ExperimentStore(Protocol):
    """Remembers which experiment directory belongs to a ``(storage_path, run_name)`` identity.

    Implementations are pickled and shipped to Ray workers, so they must be picklable, and
    neither method may raise: a failure means "nothing tracked" / "nothing to resume".
    """

    def track(self, storage_path: str, run_name: str, experiment_dir: str) -> None:
        """Record ``experiment_dir`` as the directory of the run ``(storage_path, run_name)``.

        Args:
            storage_path: The run's ``RunConfig.storage_path``.
            run_name: The run's ``RunConfig.name``.
            experiment_dir: The directory (any fsspec URL) holding the run's checkpoints.
        """
        ...

    def locate_resumable(self, storage_path: str, run_name: str) -> str | None:
        """The recorded experiment directory if it still holds a checkpoint, else None.

        Args:
            storage_path: The run's ``RunConfig.storage_path``.
            run_name: The run's ``RunConfig.name``.

        Returns:
            The experiment directory to seed the resume from, or None.
        """
        ...


def _default_root() -> str:
    return posixpath.join(storage_url(), _STORE_SUBDIR)


def _normalize(storage_path: str) -> str:
    # "s3://b/runs" and "s3://b/runs/" name the same place; so do "~/x" and its absolute form.
    path = str(storage_path)
    if "://" not in path:
        path = os.path.abspath(os.path.expanduser(path))
    return path.rstrip("/") or "/"


def record_key(storage_path: str, run_name: str) -> str:
    """The file stem under which ``(storage_path, run_name)`` is recorded (a SHA-256 hex)."""
    identity = json.dumps([_normalize(storage_path), str(run_name)])
    return hashlib.sha256(identity.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class FsspecExperimentStore:
    """An :class:`ExperimentStore` that writes one small JSON record per run to any fsspec URL.

    Each record lives at ``<root>/<sha256 of the identity>.json`` and is written atomically
    (write-then-rename on local disks; a single PUT on object stores), so a reader never sees
    half a record.

    Args:
        root: Folder or fsspec URL for the records. Defaults to
            ``$UF_STORAGE_URL/experiment_store``, or ``~/.michelangelo/uniflow/experiment_store``
            when ``UF_STORAGE_URL`` is unset. It is resolved when the store is created (on the
            driver), so every Ray worker uses the same folder whatever its own environment says.
    """

    root: str | None = None

    def __post_init__(self) -> None:
        root = self.root if self.root is not None else _default_root()
        if not isinstance(root, str) or not root.strip():
            raise InputError(
                f"FsspecExperimentStore: `root` must be a non-empty folder or fsspec URL, got "
                f"{self.root!r}; pass e.g. root='s3://bucket/experiment_store' or leave it unset."
            )
        if "://" not in root:
            root = os.path.abspath(os.path.expanduser(root))
        object.__setattr__(self, "root", root.rstrip("/") or "/")

    def record_path(self, storage_path: str, run_name: str) -> str:
        """The URL of the JSON record for ``(storage_path, run_name)``."""
        return posixpath.join(str(self.root), f"{record_key(storage_path, run_name)}.json")

    def track(self, storage_path: str, run_name: str, experiment_dir: str) -> None:
        """Record ``experiment_dir`` for ``(storage_path, run_name)``; failures are only logged.

        Args:
            storage_path: The run's ``RunConfig.storage_path``.
            run_name: The run's ``RunConfig.name``.
            experiment_dir: The directory (any fsspec URL) holding the run's checkpoints.
        """
        try:
            record = {
                "version": _RECORD_VERSION,
                "storage_path": _normalize(storage_path),
                "run_name": str(run_name),
                "experiment_dir": str(experiment_dir),
                "updated_at": time.time(),
            }
            _atomic_write(self.record_path(storage_path, run_name), json.dumps(record).encode())
        except Exception as error:  # noqa: BLE001 - the contract: tracking never fails a run
            logger.warning(
                "Experiment store at %r could not record run (storage_path=%r, name=%r): %s: %s. "
                "Auto-resume through the store will not find this run.",
                self.root, storage_path, run_name, type(error).__name__, error,
            )

    def locate_resumable(self, storage_path: str, run_name: str) -> str | None:
        """The recorded experiment directory, when it still exists and holds a checkpoint.

        Args:
            storage_path: The run's ``RunConfig.storage_path``.
            run_name: The run's ``RunConfig.name``.

        Returns:
            The experiment directory, or None when nothing was recorded, the record is
            unreadable, the directory is gone, or it holds no complete checkpoint.
        """
        path = self.record_path(storage_path, run_name)
        try:
            record = _read_record(path)
            if record is None:
                logger.info("Experiment store: no record for (storage_path=%r, name=%r) at %r.",
                            storage_path, run_name, path)
                return None
            if (record.get("storage_path"), record.get("run_name")) != (
                _normalize(storage_path), str(run_name)
            ):
                logger.warning("Experiment store record %r belongs to another run (%r, %r); "
                               "ignoring it.", path, record.get("storage_path"),
                               record.get("run_name"))
                return None
            experiment_dir = record.get("experiment_dir")
            if not isinstance(experiment_dir, str) or not experiment_dir:
                logger.warning("Experiment store record %r has no experiment_dir; ignoring it.",
                               path)
                return None
            if latest_checkpoint_dir(experiment_dir) is None:
                logger.info("Experiment store: %r holds no checkpoint to resume from.",
                            experiment_dir)
                return None
            return experiment_dir
        except Exception as error:  # noqa: BLE001 - the contract: a failed lookup is "no resume"
            logger.warning(
                "Experiment store at %r could not look up run (storage_path=%r, name=%r): %s: %s. "
                "Treating it as nothing to resume.",
                self.root, storage_path, run_name, type(error).__name__, error,
            )
            return None


def latest_checkpoint_dir(experiment_dir: str) -> str | None:
    """The most recent complete Ray checkpoint folder directly under ``experiment_dir``.

    A folder counts when its name starts with ``checkpoint_`` and it contains
    ``checkpoint.ckpt`` (a file for DDP, a folder for sharded strategies). The most recent is
    chosen by the name Ray gives the folder: Ray Train V2's ``checkpoint_<YYYY-MM-DD_HH-MM-SS.ffffff>``
    timestamps, or V1's ``checkpoint_<index>``, both compared as the value they encode. When the
    candidates do not all follow one of those schemes, the newest modification time wins
    (ties broken by name).

    Args:
        experiment_dir: A local folder or fsspec URL.

    Returns:
        The chosen folder, in the same form (local path or URL) as ``experiment_dir``, or None
        when there is none or the folder cannot be listed. Never raises.
    """
    try:
        fs, root = fsspec.core.url_to_fs(experiment_dir)
        if not fs.isdir(root):
            return None
        entries = fs.ls(root, detail=True)
        candidates = []
        for entry in entries:
            path = entry["name"].rstrip("/")
            name = posixpath.basename(path)
            if entry.get("type") != "directory" or not name.startswith(CHECKPOINT_DIR_PREFIX):
                continue
            if not fs.exists(posixpath.join(path, CHECKPOINT_FILE_NAME)):
                continue  # a folder Ray was still writing, or one left by a crash
            candidates.append((name, path, _mtime(fs, path, entry)))
        if not candidates:
            return None
        best_name, _, _ = max(candidates, key=_ordering(candidates))
        # Children are named relative to the caller's own spelling of the folder, so a URL
        # stays a URL and a local path stays a local path.
        return posixpath.join(str(experiment_dir).rstrip("/"), best_name)
    except Exception as error:  # noqa: BLE001 - an unreadable folder is "nothing to resume"
        logger.warning("Could not list checkpoints in %r: %s: %s", experiment_dir,
                       type(error).__name__, error)
        return None


def _ordering(candidates: list[tuple[str, str, float]]) -> Callable[[tuple[str, str, float]], Any]:
    names = [name for name, _, _ in candidates]
    if all(_V2_NAME.match(n) for n in names):
        return lambda c: datetime.strptime(_V2_NAME.match(c[0]).group(1), "%Y-%m-%d_%H-%M-%S.%f")
    if all(_V1_NAME.match(n) for n in names):
        return lambda c: int(_V1_NAME.match(c[0]).group(1))
    return lambda c: (c[2], c[0])


def _mtime(fs: Any, path: str, entry: dict[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    try:
        return float(fs.modified(path).timestamp())
    except Exception:  # noqa: BLE001 - many filesystems have no mtime for folders
        return 0.0


def _read_record(path: str) -> dict[str, Any] | None:
    fs, fs_path = fsspec.core.url_to_fs(path)
    if not fs.exists(fs_path):
        return None
    record = json.loads(fs.cat_file(fs_path))
    if not isinstance(record, dict):
        raise InputError(f"record is a {type(record).__name__}, not a JSON object")
    return record


def _atomic_write(path: str, data: bytes) -> None:
    fs, fs_path = fsspec.core.url_to_fs(path)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(fs_path), exist_ok=True)
        tmp = f"{fs_path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, fs_path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    # Object stores publish a PUT whole or not at all; other filesystems get a temp + move.
    parent = posixpath.dirname(fs_path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    if _publishes_whole(fs):
        fs.pipe_file(fs_path, data)
        return
    tmp = f"{fs_path}.tmp-{uuid.uuid4().hex[:8]}"
    fs.pipe_file(tmp, data)
    fs.mv(tmp, fs_path)


def _publishes_whole(fs: Any) -> bool:
    # Object stores (and the in-memory filesystem) make a single write visible all at once.
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "memory"} & set(protocols))
