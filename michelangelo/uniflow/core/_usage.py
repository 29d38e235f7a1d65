"""Where a task's time went (phases) and what it held (CPU-, GPU- and memory-hours).

Libraries record both from inside a task with :func:`record_phases` and
:func:`record_resources`; they land in the task's record as artifacts, so they survive the
run and travel back from remote attempts. ``runs show`` and the run report read them back
with :func:`task_phases` and :func:`task_usage`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from michelangelo.uniflow.core._records import TaskRecord
from michelangelo.uniflow.core._run import record_artifact

PHASES = "phases"
RESOURCES = "resources"


def record_phases(source: str, phases: list[tuple[str, float]]) -> bool:
    """Add ``(name, seconds)`` steps of ``source`` (e.g. the Ray cluster) to the running task.

    Returns whether a task was running to take them.
    """
    rows = [[str(name), round(max(float(seconds), 0.0), 3)] for name, seconds in phases]
    return record_artifact(PHASES, source=source, phases=rows)


def record_resources(*, cpu: float = 0.0, gpu: float = 0.0, memory_bytes: float = 0.0,
                     held_from: float | None = None, where: str = "") -> bool:
    """Say that the running task holds these resources from ``held_from`` (default now) on.

    The holding lasts until the task ends; :func:`task_usage` turns it into hours.
    """
    return record_artifact(RESOURCES, cpu=float(cpu), gpu=float(gpu),
                           memory_bytes=float(memory_bytes), where=where,
                           held_from=time.time() if held_from is None else float(held_from))


def task_phases(record: TaskRecord) -> list[tuple[str, float]]:
    """The task's recorded phases, in the order they were recorded."""
    out: list[tuple[str, float]] = []
    for artifact in record.artifacts:
        if artifact.get("kind") == PHASES:
            out += [(str(name), float(seconds)) for name, seconds in artifact.get("phases", [])]
    return out


@dataclass(frozen=True)
class Usage:
    """Resource-hours a task held: what a cloud bill counts."""

    cpu_h: float = 0.0
    gpu_h: float = 0.0
    memory_gib_h: float = 0.0
    held_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.cpu_h + other.cpu_h, self.gpu_h + other.gpu_h,
                     self.memory_gib_h + other.memory_gib_h, self.held_s + other.held_s)

    def describe(self) -> str:
        parts = [f"{self.cpu_h:.4f} CPU-h"]
        if self.gpu_h:
            parts.append(f"{self.gpu_h:.4f} GPU-h")
        parts.append(f"{self.memory_gib_h:.4f} GiB-h memory")
        return ", ".join(parts)


def task_usage(record: TaskRecord) -> Usage:
    """Resource-hours of the task: each holding it recorded, from its start to the task's end."""
    end = record.ended or time.time()
    total = Usage()
    for artifact in record.artifacts:
        if artifact.get("kind") != RESOURCES:
            continue
        held = max(end - float(artifact.get("held_from") or end), 0.0)
        hours = held / 3600.0
        total = total + Usage(float(artifact.get("cpu", 0.0)) * hours,
                              float(artifact.get("gpu", 0.0)) * hours,
                              float(artifact.get("memory_bytes", 0.0)) / 2**30 * hours, held)
    return total


def time_and_resources(records: list[TaskRecord]
                       ) -> tuple[list[tuple[TaskRecord, list[tuple[str, float]], str]], Usage]:
    """``(task, its phases, its usage line)`` for each task that recorded either, and the
    run's total resource-hours: what ``runs show`` and the report print."""
    rows = []
    total = Usage()
    for record in records:
        phases, held = task_phases(record), usage_line(record)
        if phases or held:
            rows.append((record, phases, held))
            total = total + task_usage(record)
    return rows, total


def usage_line(record: TaskRecord) -> str:
    """``held 5 CPU, 6.0 GiB for 80.5s: 0.1118 CPU-h, ...`` for the task, or ``""``."""
    holdings = [a for a in record.artifacts if a.get("kind") == RESOURCES]
    if not holdings:
        return ""
    usage = task_usage(record)
    shape = "; ".join(_shape(a) for a in holdings)
    return f"held {shape} for {usage.held_s:.1f}s: {usage.describe()}"


def _shape(artifact: dict[str, Any]) -> str:
    parts = [f"{artifact.get('cpu', 0):g} CPU"]
    if artifact.get("gpu"):
        parts.append(f"{artifact['gpu']:g} GPU")
    parts.append(f"{float(artifact.get('memory_bytes', 0)) / 2**30:.1f} GiB")
    where = f" ({artifact['where']})" if artifact.get("where") else ""
    return ", ".join(parts) + where
