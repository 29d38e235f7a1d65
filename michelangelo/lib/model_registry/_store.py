"""Storage layout of the registry, exclusive id claims, and staging-then-publish.

::

    <root>/<project>/<model>/
        ids/<n>                      claimed revision numbers (exclusive create, never reused)
        staging/<ms>-<uuid>/         a registration in progress (never read)
        revisions/<n>/revision.json  the revision's metadata; its presence publishes it
        revisions/<n>/weights.safetensors
        revisions/<n>/optimizer.safetensors + optimizer.json   (keep_optimizer_state only)
        aliases/<seq>.json           alias moves, in order (exclusive create)

A revision number is claimed by creating ``ids/<n>`` exclusively, so two writers can never
get the same number, whatever their timing. Files are written to a staging folder first; on
a local disk the whole folder is renamed into place (atomic), on object stores the data files
are moved first and ``revision.json`` is written last. A writer killed part-way leaves at most
a claimed number and a staging folder behind: readers never see the revision, and the next
writer claims the next number.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
import uuid
from typing import IO, Any

from michelangelo.errors import InputError
from michelangelo.uniflow.core.plugin import Storage

__all__ = ["ModelStore", "REVISION_FILE", "WEIGHTS_FILE", "OPTIMIZER_FILE", "OPTIMIZER_JSON"]

REVISION_FILE = "revision.json"
WEIGHTS_FILE = "weights.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
_STALE_STAGING_S = 6 * 3600
# fsspec's in-memory and remote "xb" check then create; in one process a lock makes that
# atomic across threads (other processes cannot see memory://, and s3/gcs do it server-side).
_EXCLUSIVE_LOCK = threading.Lock()


class ModelStore:
    """Paths and atomic operations for one registry root."""

    def __init__(self, url: str) -> None:
        self.storage = Storage(url)
        self.url = self.storage.url

    # ---- paths ---------------------------------------------------------------------------

    def model_dir(self, project: str, model: str) -> str:
        return self.storage.join(project, model)

    def revision_dir(self, project: str, model: str, revision: int) -> str:
        return self.storage.join(project, model, "revisions", str(revision))

    def file(self, project: str, model: str, revision: int, name: str) -> str:
        return posixpath.join(self.revision_dir(project, model, revision), name)

    # ---- listing -------------------------------------------------------------------------

    def projects(self) -> list[str]:
        return [p for p in self.storage.listdir(self.storage.root) if not p.startswith(".")]

    def models(self, project: str) -> list[str]:
        return self.storage.listdir(self.storage.join(project))

    def revisions(self, project: str, model: str) -> list[int]:
        """Published revision numbers, ascending."""
        folder = self.storage.join(project, model, "revisions")
        numbers = sorted(int(n) for n in self.storage.listdir(folder) if n.isdigit())
        return [n for n in numbers
                if self.storage.exists(self.file(project, model, n, REVISION_FILE))]

    # ---- exclusive create ----------------------------------------------------------------

    def _create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists; True if this call created it."""
        if self.storage.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            return True
        with _EXCLUSIVE_LOCK:
            try:
                with self.storage.fs.open(path, "xb") as handle:
                    handle.write(data)
            except FileExistsError:
                return False
            except (NotImplementedError, ValueError) as error:
                raise InputError(
                    f"the registry's storage {self.url!r} does not support exclusive file "
                    f"creation ({error}), which revision numbering relies on. Fix: use a local "
                    "folder, memory://, or an object store whose fsspec driver supports "
                    "mode='xb' (s3fs, gcsfs)."
                ) from None
        return True

    def _claim_next(self, folder: str, width: int, payload: dict[str, Any]) -> int:
        taken = [int(n.split(".")[0]) for n in self.storage.listdir(folder)
                 if n.split(".")[0].isdigit()]
        number = max(taken, default=0) + 1
        data = json.dumps(payload).encode()
        suffix = ".json" if width else ""
        while True:
            name = f"{number:0{width}d}{suffix}" if width else str(number)
            if self._create_exclusive(posixpath.join(folder, name), data):
                return number
            number += 1

    def claim_revision(self, project: str, model: str) -> int:
        """Claim the next revision number of ``project/model`` (never reused)."""
        payload = {"pid": os.getpid(), "time": time.time(), "token": uuid.uuid4().hex}
        return self._claim_next(self.storage.join(project, model, "ids"), 0, payload)

    # ---- staging and publish -------------------------------------------------------------

    def new_staging(self, project: str, model: str) -> str:
        self._drop_stale_staging(project, model)
        path = self.storage.join(project, model, "staging",
                                 f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}")
        self.storage.makedirs(path)
        return path

    def _drop_stale_staging(self, project: str, model: str) -> None:
        folder = self.storage.join(project, model, "staging")
        now_ms = time.time() * 1000
        for name in self.storage.listdir(folder):
            started = name.split("-", 1)[0]
            if started.isdigit() and now_ms - int(started) > _STALE_STAGING_S * 1000:
                with contextlib.suppress(OSError):  # another writer cleaning it too
                    self.storage.remove(posixpath.join(folder, name))

    def write(self, path: str, data: bytes) -> None:
        self.storage.write_bytes(path, data)

    def open_write(self, path: str) -> IO[bytes]:
        """A file to stream into; only used inside a staging folder, which readers ignore."""
        if self.storage.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return open(path, "wb")  # noqa: SIM115 - the caller's with-block closes it
        return self.storage.fs.open(path, "wb")

    def open_read(self, path: str) -> IO[bytes]:
        if self.storage.is_local:
            return open(path, "rb")  # noqa: SIM115 - the caller's with-block closes it
        return self.storage.fs.open(path, "rb")

    def local_path(self, path: str) -> str | None:
        """``path`` as a file on this machine's disk, or None on other filesystems."""
        return path if self.storage.is_local else None

    def size(self, path: str) -> int:
        if self.storage.is_local:
            return os.path.getsize(path)
        return int(self.storage.fs.size(path))

    def publish(self, staging: str, project: str, model: str, revision: int,
                metadata: dict[str, Any]) -> None:
        """Make ``staging`` revision ``revision``; ``revision.json`` is what makes it visible."""
        final = self.revision_dir(project, model, revision)
        record = json.dumps(metadata, indent=1).encode()
        if self.storage.is_local:
            self.storage.write_bytes(posixpath.join(staging, REVISION_FILE), record)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(staging, final)  # atomic; fails if final exists, which claims prevent
            return
        fs = self.storage.fs
        for path in fs.ls(staging, detail=False):
            fs.mv(path, posixpath.join(final, posixpath.basename(path.rstrip("/"))))
        self.storage.write_bytes(posixpath.join(final, REVISION_FILE), record)
        self.storage.remove(staging)

    def discard(self, staging: str) -> None:
        with contextlib.suppress(OSError):
            self.storage.remove(staging)

    def delete_revision(self, project: str, model: str, revision: int) -> None:
        """Unpublish first (revision.json), then remove the files."""
        self.storage.remove(self.file(project, model, revision, REVISION_FILE))
        self.storage.remove(self.revision_dir(project, model, revision))

    # ---- aliases -------------------------------------------------------------------------

    def alias_events(self, project: str, model: str) -> list[dict[str, Any]]:
        folder = self.storage.join(project, model, "aliases")
        events = []
        for name in self.storage.listdir(folder):
            if name.endswith(".json") and name[:-5].isdigit():
                event = self.storage.try_read_json(posixpath.join(folder, name))
                if event is not None:
                    event["seq"] = int(name[:-5])
                    events.append(event)
        return sorted(events, key=lambda e: e["seq"])

    def append_alias_event(self, project: str, model: str, event: dict[str, Any]) -> int:
        return self._claim_next(self.storage.join(project, model, "aliases"), 8, event)
