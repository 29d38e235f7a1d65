"""Which Ray Train worker failed, where it ran, and the last lines it wrote.

Ray Train V2 keeps a structured log per worker (``logs/train/ray-train-app-worker-<id>.log``,
one JSON object a line carrying ``world_rank`` and ``node_id``) next to the worker process's
own stdout/stderr files (``logs/worker-<id>-<job>-<pid>.out/.err``). Given the folder those
files were copied to, this finds the failing rank's files and tails them for the console.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from typing import Any

TAIL_LINES = 20
# Lines Ray writes into every worker log file to say which job, actor or task follows.
_RAY_MARKER = re.compile(r"^:(job_id|actor_name|task_name):")


def failed_ranks(exc: BaseException) -> list[int]:
    """The ranks a Ray Train ``WorkerGroupError`` in ``exc``'s chain names, lowest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        failures = getattr(current, "worker_failures", None)
        if isinstance(failures, dict) and failures:
            return sorted(int(rank) for rank in failures)
        current = current.__cause__ or current.__context__
    return []


def worker_identity(logs: str, rank: int, run_name: str | None = None) -> dict[str, Any] | None:
    """``{"worker_id", "node_id"}`` of the worker with ``rank`` (of ``run_name`` if given)."""
    candidates = glob.glob(os.path.join(logs, "train", "ray-train-app-worker-*.log"))
    candidates.sort(key=lambda p: os.path.getmtime(p), reverse=True)  # newest attempt first
    for path in candidates:
        first = _first_json(path)
        if first is None or first.get("world_rank") != rank:
            continue
        if run_name and first.get("run_name") not in (None, run_name):
            continue
        return {"worker_id": first.get("worker_id"), "node_id": first.get("node_id"),
                "train_log": path}
    return None


def tail_worker(logs: str, identity: dict[str, Any], lines: int = TAIL_LINES) -> tuple[str, list[str]]:
    """``(files, last lines)`` of the worker's stdout then stderr, else of its Train log.

    The two streams carry no timestamps to merge by; stderr goes last because Python
    logging and tracebacks, usually the most telling lines, are written there.
    """
    worker_id = identity.get("worker_id") or "?"
    names, kept = [], []
    for suffix in (".out", ".err"):
        for path in sorted(glob.glob(os.path.join(logs, f"worker-{worker_id}-*{suffix}"))):
            tail = [line for line in _tail(path, lines * 2) if not _RAY_MARKER.match(line)]
            if tail:
                names.append(os.path.basename(path))
                kept += tail
    if kept:
        return ", ".join(names), kept[-lines:]
    path = identity.get("train_log")
    if path:
        messages = []
        with contextlib.suppress(OSError), open(path, errors="replace") as handle:
            for line in handle:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    messages.append(f"{record.get('levelname', '')} {record.get('message', '')}")
        return os.path.basename(path), messages[-lines:]
    return "", []


def failure_detail(exc: BaseException, logs: str, node_names: dict[str, str] | None = None
                   ) -> dict[str, Any] | None:
    """What the console shows about the failing worker, or None when no worker failed."""
    ranks = failed_ranks(exc)
    if not ranks or not os.path.isdir(logs):
        return None
    rank = ranks[0]
    identity = worker_identity(logs, rank)
    if identity is None:
        return {"worker": f"rank {rank}", "lines": []}
    source, lines = tail_worker(logs, identity)
    node = identity.get("node_id") or ""
    where = (node_names or {}).get(node) or (node[:8] if node else "unknown node")
    others = f" (ranks failing: {', '.join(map(str, ranks))})" if len(ranks) > 1 else ""
    return {
        "worker": f"rank {rank} on node {where}{others}",
        "rank": rank,
        "node_id": node,
        "source": source,
        "lines": lines,
    }


def node_names() -> dict[str, str]:
    """Node id -> ``address (id prefix)`` of the connected cluster's nodes."""
    import ray

    names = {}
    with contextlib.suppress(Exception):
        for node in ray.nodes():
            node_id = node.get("NodeID", "")
            names[node_id] = f"{node.get('NodeManagerAddress', '?')} ({node_id[:8]})"
    return names


def _first_json(path: str) -> dict | None:
    with contextlib.suppress(OSError, ValueError), open(path, errors="replace") as handle:
        return json.loads(handle.readline())
    return None


def _tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(size - 64 * 1024, 0))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    # Progress bars redraw with carriage returns: keep each redraw's final state only.
    kept = [part.split("\r")[-1] for part in text.split("\n")]
    kept = [line for line in kept if line.strip()]
    return kept[-lines:]
