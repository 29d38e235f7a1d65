"""Run and task records: the persisted state machine of a workflow run."""

from __future__ import annotations

import enum
import posixpath
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from michelangelo.uniflow.core._storage import Storage


class TaskState(str, enum.Enum):
    """Lifecycle of one task call: pending -> running -> succeeded | failed.

    A call satisfied without running its body ends as ``cached`` (opt-in cache) or ``reused``
    (taken from the run being resumed).
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CACHED = "cached"
    REUSED = "reused"

    @property
    def done_ok(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.CACHED, TaskState.REUSED)

    @property
    def is_final(self) -> bool:
        """Whether no transition leaves this state."""
        return self not in _TASK_TRANSITIONS

    def can_become(self, other: TaskState) -> bool:
        """Whether a task in this state may move to ``other`` (``running`` again: a retry)."""
        return other in _TASK_TRANSITIONS.get(self, ())


_TASK_TRANSITIONS = {
    TaskState.PENDING: (TaskState.RUNNING, TaskState.CACHED, TaskState.REUSED),
    TaskState.RUNNING: (TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED),
}


class RunState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class _JsonRecord:
    """JSON (de)serialisation shared by the records: their ``state`` is stored as text."""

    _STATES: ClassVar[type[enum.Enum]]

    def to_json(self) -> dict:
        data = asdict(self)  # type: ignore[call-overload]
        data["state"] = data["state"].value
        return data

    @classmethod
    def from_json(cls, data: dict):
        data = dict(data)
        data["state"] = cls._STATES(data["state"])
        return cls(**data)


@dataclass
class TaskRecord(_JsonRecord):
    call_id: str
    task_name: str
    state: TaskState = TaskState.PENDING
    key: str | None = None
    code_fingerprint: str | None = None
    inputs_fingerprint: str | None = None
    attempts: int = 0
    started: float | None = None
    ended: float | None = None
    error: dict | None = None
    output: dict | None = None  # {"io", "folder", "meta"}
    source_run: str | None = None  # the run whose result was reused or cached
    config: str | None = None
    # What the body made or decided besides its result, appended by any library through
    # ``uniflow.record_artifact``: {"kind": ..., "time": ..., **fields} (capacity decisions,
    # metric files, registry revisions, deployments).
    artifacts: list[dict] = field(default_factory=list)
    _STATES: ClassVar[type[enum.Enum]] = TaskState

    @property
    def duration_s(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started



@dataclass
class RunRecord(_JsonRecord):
    run_id: str
    workflow: str
    state: RunState = RunState.RUNNING
    started: float = field(default_factory=time.time)
    ended: float | None = None
    arguments: dict[str, str] = field(default_factory=dict)
    resumed_from: str | None = None
    error: dict | None = None
    storage_url: str = ""
    tasks: list[str] = field(default_factory=list)  # call ids in call order
    # How each concurrent batch was placed: {"batch", "branches", "at_once", "why", "time"}.
    batches: list[dict] = field(default_factory=list)
    _STATES: ClassVar[type[enum.Enum]] = RunState



class RunStore:
    """Reads and writes records under ``<root>/runs/<run_id>/``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def run_dir(self, run_id: str) -> str:
        return self.storage.join("runs", run_id)

    def call_dir(self, run_id: str, call_id: str) -> str:
        return self.storage.join("runs", run_id, "tasks", call_id)

    def save_run(self, record: RunRecord) -> None:
        self.storage.write_json(posixpath.join(self.run_dir(record.run_id), "run.json"),
                                record.to_json())

    def load_run(self, run_id: str) -> RunRecord | None:
        data = self.storage.try_read_json(posixpath.join(self.run_dir(run_id), "run.json"))
        return RunRecord.from_json(data) if data else None

    def save_task(self, run_id: str, record: TaskRecord) -> None:
        path = posixpath.join(self.call_dir(run_id, record.call_id), "record.json")
        self.storage.write_json(path, record.to_json())

    def load_task(self, run_id: str, call_id: str) -> TaskRecord | None:
        path = posixpath.join(self.call_dir(run_id, call_id), "record.json")
        data = self.storage.try_read_json(path)
        return TaskRecord.from_json(data) if data else None

    def load_tasks(self, run_id: str) -> list[TaskRecord]:
        # Call ids are zero-padded sequence numbers, so the folder listing is call order; it
        # also covers a run that was killed before run.json listed its calls.
        ids = self.storage.listdir(self.storage.join("runs", run_id, "tasks"))
        records = [self.load_task(run_id, call_id) for call_id in ids]
        return [r for r in records if r is not None]

    def list_runs(self) -> list[RunRecord]:
        runs = []
        for run_id in self.storage.listdir(self.storage.join("runs")):
            record = self.load_run(run_id)
            if record is not None:
                runs.append(record)
        return sorted(runs, key=lambda r: r.started, reverse=True)

    def log_path(self, run_id: str, call_id: str, attempt: int) -> str:
        return posixpath.join(self.call_dir(run_id, call_id), "logs", f"attempt-{attempt}.log")

    def describe_args(self, arguments: dict[str, Any]) -> dict[str, str]:
        return {k: repr(v)[:120] for k, v in arguments.items()}
