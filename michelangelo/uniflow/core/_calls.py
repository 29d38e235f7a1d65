"""The call state machine: one task call of a run, from its key to its final state.

A call is reused from the run it resumes, or from the cache, or executed: attempt after
attempt (in this process, or elsewhere through the task's plugin) until one succeeds or the
retries are spent. Every state change goes through :meth:`TaskCalls._transition`.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
from typing import Any

from michelangelo.errors import InputTypeError, InternalError
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._failures import error_dict, summarized, task_failed
from michelangelo.uniflow.core._fingerprint import call_key, inputs_fingerprint
from michelangelo.uniflow.core._plugin import TaskPlugin, find_plugin
from michelangelo.uniflow.core._records import RunRecord, RunStore, TaskRecord, TaskState
from michelangelo.uniflow.core._remote import (
    prepare_remote_call,
    read_remote_artifacts,
    read_remote_result,
)
from michelangelo.uniflow.core._runtime import CallInfo, reset_current_call, set_current_call
from michelangelo.uniflow.core._storage import Storage, default_storage_url
from michelangelo.uniflow.core._timeout import time_limit
from michelangelo.uniflow.core._values import (
    MISSING,
    load_output,
    persist_value,
    resolve_futures,
    resolve_handles,
)
from michelangelo.uniflow.core.errors import RemoteTaskError


class TaskCalls:
    """The task calls of a run: the part of ``Run`` that calls tasks (a mixin of ``Run``).

    ``task`` is a :class:`~michelangelo.uniflow.core.Task`, used by its attributes only:
    the task module sits above the run (calling a task outside a run starts one).
    """

    # Set by Run.__init__ (with the services these methods call: info, add_artifact,
    # reserve_call_id, _output_log).
    storage: Storage
    store: RunStore
    reporter: Reporter
    record: RunRecord
    _previous: dict[str, TaskRecord]
    _running: dict[str, TaskRecord]
    _record_lock: threading.Lock

    def call_task(self, task: Any, args: tuple, kwargs: dict) -> Any:
        call_id = self.reserve_call_id(task.name)
        return self.call_task_as(task, call_id, args, kwargs)

    def call_task_as(self, task: Any, call_id: str, args: tuple, kwargs: dict, *,
                     label: str | None = None) -> Any:
        """Call ``task`` under a call id already reserved; ``label`` names it in errors."""
        args, kwargs = resolve_futures(args, kwargs)
        arguments = bind_arguments(task.signature, args, kwargs, task.name)
        input_fp = inputs_fingerprint(arguments)
        key = call_key(task.identity, task.code_fingerprint, input_fp, task.cache_version)
        record = TaskRecord(
            call_id=call_id,
            task_name=task.name,
            key=key,
            code_fingerprint=task.code_fingerprint,
            inputs_fingerprint=input_fp,
            config=repr(task.config) if task.config is not None else None,
        )
        reused = self._from_previous(record) or (task.cache and self._from_cache(record))
        if reused:
            return reused[0]
        return self._execute(task, record, arguments, label or task.name)

    def _from_previous(self, record: TaskRecord) -> tuple[Any] | None:
        previous = self._previous.get(record.call_id)
        if previous is None or not previous.state.done_ok or previous.key is None:
            return None
        if previous.key != record.key or previous.output is None:
            return None
        value = self._load_output(previous.output)
        if value is MISSING:
            return None
        self._transition(record, TaskState.REUSED, output=previous.output,
                         source_run=previous.source_run or self.record.resumed_from)
        return (value,)

    def _from_cache(self, record: TaskRecord) -> tuple[Any] | None:
        if record.key is None:
            return None
        entry = self.storage.try_read_json(self._cache_entry(record.key))
        if not entry:
            return None
        value = self._load_output(entry["output"])
        if value is MISSING:
            return None
        self._transition(record, TaskState.CACHED, output=entry["output"],
                         source_run=entry.get("run_id"))
        return (value,)

    def _transition(self, record: TaskRecord, state: TaskState, **fields: Any) -> None:
        """The one way a task's state changes: checked, stamped, saved, then announced.

        Raises:
            InternalError: ``state`` does not follow the record's state (a uniflow bug).
        """
        if not record.state.can_become(state):
            raise InternalError(
                f"task {record.call_id}: {record.state.value} -> {state.value} is not a task "
                "transition (a bug in uniflow; please report it)")
        now = time.time()
        record.state = state
        for name, value in fields.items():
            setattr(record, name, value)
        record.started = record.started or now
        if state.is_final:
            record.ended = now
        self.store.save_task(self.run_id, record)
        # The reporter gets this transition's copy: a concurrent branch's record changes in
        # its own thread, and a console reading the live object would see a state it has
        # not been told of yet (an "in flight" line that left out a running branch).
        self.reporter.task_changed(copy.copy(record))

    def _cache_entry(self, key: str) -> str:
        return self.storage.join("cache", f"{key}.json")

    def _load_output(self, output: dict) -> Any:
        return load_output(self.storage, output)

    def _execute(self, task: Any, record: TaskRecord, arguments: dict[str, Any],
                 label: str) -> Any:
        plugin = find_plugin(task.config)
        elsewhere = plugin.runs_elsewhere(task.config, self)
        call_dir = self.store.call_dir(self.run_id, record.call_id)
        record.started = time.time()
        last_exc: BaseException | None = None
        for attempt in range(1, task.retries + 2):
            self._transition(record, TaskState.RUNNING, attempts=attempt)
            info = CallInfo(self.run_id, record.call_id, task.name, attempt, self.storage, call_dir)
            log_path = self.store.log_path(self.run_id, record.call_id, attempt)
            token = set_current_call(info)
            with self._record_lock:
                self._running[record.call_id] = record
            try:
                if not elsewhere:
                    plugin.check_body(task.config, task.fn)
                with (
                    self._output_log(log_path),
                    plugin.execution(task.config, self),
                ):
                    if elsewhere:
                        travelling = self._attempt_elsewhere(plugin, task, record, call_dir,
                                                             arguments)
                    else:
                        resolved = resolve_handles(task.annotations, arguments)
                        with time_limit(task.timeout, task.name):
                            value = task.fn(**resolved)
                        travelling = self._persist(record, call_dir, value)
            except Exception as exc:
                last_exc = exc
                record.error = error_dict(exc)
                retryable = getattr(exc, "uniflow_retryable", True) and attempt <= task.retries
                if retryable:
                    self.info(f"task {record.call_id} attempt {attempt} failed "
                              f"({type(exc).__name__}: {exc}); retrying")
                    continue
                break
            except BaseException as exc:  # Ctrl-C, SystemExit: record and stop at once
                self._transition(record, TaskState.FAILED, error=error_dict(exc))
                raise
            finally:
                reset_current_call(token)
                with self._record_lock:
                    self._running.pop(record.call_id, None)
            if task.cache and record.key is not None:  # the output is already persisted
                self.storage.write_json(
                    self._cache_entry(record.key),
                    {"output": record.output, "run_id": self.run_id, "task": task.identity},
                )
            self._transition(record, TaskState.SUCCEEDED, error=None)
            return travelling

        assert last_exc is not None
        assert record.error is not None
        self._transition(record, TaskState.FAILED,
                         error={**record.error, "logs_command": self._logs_command(record.call_id)})
        raise summarized(task_failed(last_exc, label), self.reporter)

    def _logs_command(self, call_id: str) -> str:
        """The command that prints the task's whole log, from any shell: the storage is
        named unless it is the default one (``$UF_STORAGE_URL`` may be set only here, as a
        ``--sandbox`` run sets it for itself)."""
        command = f"michelangelo runs logs {self.run_id} {call_id}"
        if self.storage.url != default_storage_url():
            command += f" --storage-url {self.storage.url}"
        return command

    def _persist(self, record: TaskRecord, call_dir: str, value: Any) -> Any:
        record.output, travelling = persist_value(self.storage, call_dir, record.attempts, value)
        return travelling

    def _attempt_elsewhere(self, plugin: TaskPlugin, task: Any, record: TaskRecord,
                           call_dir: str, arguments: dict[str, Any]) -> Any:
        """One attempt run by the plugin somewhere else; its result comes back via storage."""
        call = prepare_remote_call(self.storage, task, self.run_id, record.call_id,
                                   record.attempts, call_dir, arguments)
        plugin.run_elsewhere(task.config, self, call)
        for entry in read_remote_artifacts(self.storage, call):
            self.add_artifact(record.call_id, entry)
        output = read_remote_result(self.storage, call)
        value = load_output(self.storage, output)
        if value is MISSING:
            raise RemoteTaskError(
                f"task {task.name!r}: the remote attempt reported its result at "
                f"{output['folder']}, but this machine cannot see it there. Use a storage URL "
                "both this machine and the cluster can reach."
            )
        record.output = output
        return value


def bind_arguments(signature: inspect.Signature, args: tuple, kwargs: dict,
                   name: str) -> dict[str, Any]:
    """A call's arguments by parameter name, defaults applied.

    Raises:
        TypeError: The arguments do not fit the signature (as calling the function would).
    """
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InputTypeError(f"{name}(): {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)
