"""Where uniflow keeps runs, task results and caches: any fsspec URL."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

ENV_STORAGE_URL = "UF_STORAGE_URL"
_DEFAULT_ROOT = os.path.join("~", ".michelangelo", "uniflow")


def default_storage_url() -> str:
    """The storage root when ``$UF_STORAGE_URL`` is not set: ``~/.michelangelo/uniflow``."""
    return os.path.abspath(os.path.expanduser(_DEFAULT_ROOT))


def storage_url() -> str:
    """The storage root: ``$UF_STORAGE_URL`` or ``~/.michelangelo/uniflow``."""
    url = os.environ.get(ENV_STORAGE_URL) or default_storage_url()
    if "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/")


class Storage:
    """A thin layer over one fsspec filesystem rooted at a URL, with atomic writes."""

    def __init__(self, url: str | None = None) -> None:
        self.url = (url or storage_url()).rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def join(self, *parts: str) -> str:
        """A filesystem path (no protocol) under the root."""
        return posixpath.join(self.root, *parts)

    def url_of(self, path: str) -> str:
        """The full URL of a path on this filesystem (what Ray or pyarrow are given)."""
        if self.is_local:
            return path
        return self.fs.unstrip_protocol(path)

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a file so that readers see either nothing or all of it."""
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        else:  # object stores publish a PUT whole or not at all
            self.fs.pipe_file(path, data)

    def read_bytes(self, path: str) -> bytes:
        if self.is_local:
            with open(path, "rb") as handle:
                return handle.read()
        return self.fs.cat_file(path)

    def write_json(self, path: str, value: Any) -> None:
        self.write_bytes(path, json.dumps(value, indent=1, default=str).encode())

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_bytes(path))

    def try_read_json(self, path: str) -> Any | None:
        try:
            return self.read_json(path)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def staging_dir(self, final: str) -> str:
        """A fresh folder beside ``final`` to write into before :meth:`publish`."""
        path = f"{final}.staging-{uuid.uuid4().hex[:8]}"
        self.makedirs(path)
        return path

    def publish(self, staging: str, final: str) -> None:
        """Move a fully written staging folder to its final place."""
        if self.exists(final):
            self.fs.rm(final, recursive=True)
        if self.is_local:
            os.replace(staging, final)
            return
        # Object by object: an object store has no folders to rename, and its "folder" may not
        # exist as a key at all (s3fs's makedirs writes none), which a recursive mv trips on.
        root = self.fs._strip_protocol(staging).rstrip("/")
        target = self.fs._strip_protocol(final).rstrip("/")
        for path in self.fs.find(staging):
            self.fs.mv(path, target + path[len(root):])
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def remove(self, path: str) -> None:
        if self.exists(path):
            self.fs.rm(path, recursive=True)

    def listdir(self, path: str) -> list[str]:
        if not self.exists(path):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False))
