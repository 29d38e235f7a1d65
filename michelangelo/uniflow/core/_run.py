"""One workflow run: calls tasks, persists their results, resumes and caches."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import datetime
import inspect
import os
import posixpath
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from michelangelo.uniflow.core import _builtin_io  # noqa: F401  (registers the built-in IOs)
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._fingerprint import call_key, inputs_fingerprint
from michelangelo.uniflow.core._io import io_named, write_value
from michelangelo.uniflow.core._logs import capture_output, capture_thread_output
from michelangelo.uniflow.core._plugin import TaskPlugin, find_plugin
from michelangelo.uniflow.core._records import (
    RunRecord,
    RunState,
    RunStore,
    TaskRecord,
    TaskState,
)
from michelangelo.uniflow.core._remote import (
    prepare_remote_call,
    read_remote_artifacts,
    read_remote_result,
)
from michelangelo.uniflow.core._runtime import (
    CallInfo,
    current_call,
    reset_current_call,
    set_current_call,
)
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core._timeout import time_limit
from michelangelo.uniflow.core.errors import RemoteTaskError, RunNotFoundError

if TYPE_CHECKING:
    from michelangelo.uniflow.core._task import Task

_ACTIVE_RUN: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "uniflow_active_run", default=None
)


class CallScope:
    """Numbers the task calls made in one thread of control (the workflow, or one branch).

    The workflow body numbers its calls ``001-``, ``002-``, ...; a concurrent branch numbers
    the calls it makes itself under its own prefix (``003-train[1].001-``), so that every id
    depends only on call order within its branch, never on how branches interleave.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._count = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._count += 1
            return self._count


_SCOPE: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "uniflow_call_scope", default=None
)


@contextlib.contextmanager
def call_scope(prefix: str) -> Iterator[None]:
    """Number the task calls made inside the block under ``prefix``."""
    token = _SCOPE.set(CallScope(prefix))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def active_run() -> Run | None:
    return _ACTIVE_RUN.get()


def record_artifact(kind: str, **fields: Any) -> bool:
    """Append ``{"kind": kind, "time": now, **fields}`` to the running task's record.

    Any library can call it from a task body on the driver (capacity decisions, metric
    files, registry revisions, deployments); ``michelangelo runs report`` shows them. Values
    must be JSON-able. An entry equal to the task's previous one of the same kind is kept
    once. Fields whose names start with ``_`` are kept for programs (a plugin acting on the
    entry) and left out of the report. In a remote attempt the entries travel back with its
    result. Returns whether a task was running to take it.
    """
    run, call = active_run(), current_call()
    if call is None:
        return False
    entry = {"kind": kind, **fields}
    if run is None:
        if call.artifacts is None:
            return False
        if not _repeats(call.artifacts, entry):  # a remote attempt: kept for its result file
            call.artifacts.append({**entry, "time": time.time()})
        return True
    return run.add_artifact(call.call_id, entry)


def _repeats(artifacts: list[dict], entry: dict[str, Any]) -> bool:
    """Whether ``entry`` equals the last artifact of its kind (its time aside)."""
    same_kind = [a for a in artifacts if a.get("kind") == entry.get("kind")]
    return bool(same_kind) and {k: v for k, v in same_kind[-1].items() if k != "time"} == entry


def new_run_id(workflow: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


class Run:
    """State and side effects of one run of a workflow (or of a task called on its own)."""

    def __init__(
        self,
        workflow: str,
        *,
        storage: Storage | None = None,
        reporter: Reporter | None = None,
        resume: str | None = None,
        run_id: str | None = None,
        mode: str = "local-run",
        options: dict[str, Any] | None = None,
    ) -> None:
        self.storage = storage or Storage()
        self.mode = mode  # "local-run" or "remote-run": plugins decide what remote means
        self.options: dict[str, Any] = dict(options or {})  # plugin options (Context options)
        self.store = RunStore(self.storage)
        self.reporter = reporter or Reporter()
        self.record = RunRecord(
            run_id=run_id or new_run_id(workflow),
            workflow=workflow,
            storage_url=self.storage.url,
            resumed_from=resume,
        )
        self.resources: dict[str, Any] = {}  # plugin state that lives as long as the run
        self._cleanups: list[Callable[[], None]] = []
        self._root_scope = CallScope()
        self._running: dict[str, TaskRecord] = {}
        self._warned: set[str] = set()
        self._record_lock = threading.Lock()
        self._warn_lock = threading.Lock()
        # Concurrent branches in flight: their attempts log per thread, not per process.
        self._concurrent = 0
        self._batches: list[Any] = []  # what concurrent.batch_run started (settled at the end)
        self._previous: dict[str, TaskRecord] = {}
        if resume is not None:
            if self.store.load_run(resume) is None:
                raise RunNotFoundError(
                    f"--resume {resume!r}: no such run under {self.storage.url}. "
                    "List runs with `michelangelo runs list`."
                )
            self._previous = {r.call_id: r for r in self.store.load_tasks(resume)}

    @property
    def run_id(self) -> str:
        return self.record.run_id

    # -- services offered to plugins -------------------------------------------------------
    def add_cleanup(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the run ends, however it ends (last added runs first)."""
        self._cleanups.append(fn)

    def status(self, message: str) -> contextlib.AbstractContextManager[None]:
        return self.reporter.status(message)

    def info(self, message: str) -> None:
        self.reporter.info(message)

    def warn(self, message: str) -> None:
        """Show a warning on the console, once per run for the same text."""
        with self._warn_lock:
            if message in self._warned:
                return
            self._warned.add(message)
        self.reporter.warning(message)

    def progress(self, key: str, state: dict[str, Any] | None) -> None:
        """Live progress of a long step (``None`` removes it); safe from any thread."""
        self.reporter.progress(key, state)

    def add_artifact(self, call_id: str, entry: dict[str, Any]) -> bool:
        """Append to a running task's artifacts; an entry that has a ``time`` keeps it."""
        entry = dict(entry)
        at = entry.pop("time", None)
        with self._record_lock:
            record = self._running.get(call_id)
            if record is None:
                return False
            if _repeats(record.artifacts, entry):
                return True
            record.artifacts.append({**entry, "time": at if at is not None else time.time()})
            self.store.save_task(self.run_id, record)
        return True

    # -- concurrent branches (michelangelo.uniflow.core.lib.concurrent) ----------------------
    def reserve_call_id(self, name: str, *, branch: int | None = None,
                        sequence: int | None = None) -> str:
        """The next call id in this thread's scope (``003-train``), listed in the run now.

        ``sequence`` reuses a number taken with :meth:`next_sequence` (a batch's branches
        share one: ``003-train[0]``, ``003-train[1]``); ``branch`` adds the index.
        """
        scope = _SCOPE.get() or self._root_scope
        number = scope.next() if sequence is None else sequence
        call_id = f"{scope.prefix}{number:03d}-{name}"
        if branch is not None:
            call_id += f"[{branch}]"
        with self._record_lock:
            # run.json lists the calls when the run ends; while it goes, the call folders do.
            self.record.tasks.append(call_id)
        return call_id

    def next_sequence(self) -> tuple[str, int]:
        """A call number for a batch of branches: ``(scope prefix, number)``."""
        scope = _SCOPE.get() or self._root_scope
        return scope.prefix, scope.next()

    def concurrency_changed(self, delta: int) -> None:
        """Count batches in flight (+1 when one starts, -1 when its last branch ends).

        While any is in flight, every attempt logs its own thread's output, since the
        process-wide redirection of one attempt would swallow the others'.
        """
        with self._record_lock:
            self._concurrent += delta

    def track_batch(self, batch: Any) -> None:
        """Keep ``batch`` (with ``wait()`` and ``stop()``) to settle when the run ends."""
        with self._record_lock:
            self._batches.append(batch)

    def record_batch(self, entry: dict[str, Any]) -> None:
        """Keep how a batch was placed (``michelangelo runs report`` shows it)."""
        with self._record_lock:
            self.record.batches.append({**entry, "time": time.time()})
            self.store.save_run(self.record)

    def _settle_batches(self, *, ok: bool) -> None:
        # A branch nobody waited for still belongs to the run: wait for it after success;
        # after a failure or Ctrl-C, stop what still runs and start nothing new.
        while True:
            with self._record_lock:
                if not self._batches:
                    return
                batch = self._batches.pop()
            if ok:
                batch.wait()
            else:
                batch.stop()

    def _output_log(self, path: str) -> contextlib.AbstractContextManager[None]:
        """Capture the process output into ``path`` (a storage path) as the reporter wants."""
        capture = capture_thread_output if self._concurrent else capture_output
        if self.storage.is_local:
            return capture(path, quiet=self.reporter.quiet, on_warning=self.warn)
        if not self.reporter.quiet:
            return contextlib.nullcontext()
        return self._captured_remote(path, capture)

    @contextlib.contextmanager
    def _captured_remote(self, path: str, capture: Callable[..., Any]) -> Iterator[None]:
        # Remote storage cannot be appended to: log to a local file, upload it afterwards.
        handle, local = tempfile.mkstemp(prefix="uniflow-", suffix=".log")
        os.close(handle)
        try:
            with capture(local, quiet=True, on_warning=self.warn):
                yield
        finally:
            with contextlib.suppress(Exception), open(local, "rb") as log:
                self.storage.write_bytes(path, log.read())
            os.unlink(local)

    # -- the run as a whole ------------------------------------------------------------------
    def execute(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self.record.arguments = self.store.describe_args(
            _bind(inspect.signature(fn), args, kwargs, getattr(fn, "__name__", "workflow")))
        self.store.save_run(self.record)
        self.reporter.run_started(self.record)
        token = _ACTIVE_RUN.set(self)
        # Output between tasks (the workflow body, cluster teardown) has a log of its own.
        driver_log = posixpath.join(self.store.run_dir(self.run_id), "logs", "driver.log")
        outer = self._output_log(driver_log) if self.reporter.quiet else contextlib.nullcontext()
        try:
            with outer:
                value = self._body(fn, args, kwargs)
        except BaseException as exc:
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
            self.record.state = RunState.INTERRUPTED if interrupted else RunState.FAILED
            self.record.error = _error_dict(exc)
            raise
        else:
            self.record.state = RunState.SUCCEEDED
            return value
        finally:
            _ACTIVE_RUN.reset(token)
            try:
                self._close()
            finally:
                self.record.ended = time.time()
                self.store.save_run(self.record)
                self.reporter.run_finished(self.record)

    def _body(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            value = fn(*args, **kwargs)
            self._settle_batches(ok=True)
            return value
        except BaseException:
            self._settle_batches(ok=False)
            raise
        finally:
            self._close_quietly()

    def _close_quietly(self) -> None:
        # Cleanups (cluster teardown) run inside the driver log; errors surface in _close.
        try:
            self._close()
        except Exception as exc:  # noqa: BLE001 - re-raised by the outer _close
            self._cleanups.append(_raiser(exc))

    def _close(self) -> None:
        errors = []
        while self._cleanups:
            cleanup = self._cleanups.pop()
            try:
                cleanup()
            except Exception as exc:  # keep cleaning; report after
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- one task call ---------------------------------------------------------------------
    def call_task(self, task: Task, args: tuple, kwargs: dict) -> Any:
        call_id = self.reserve_call_id(task.name)
        return self.call_task_as(task, call_id, args, kwargs)

    def call_task_as(self, task: Task, call_id: str, args: tuple, kwargs: dict, *,
                     label: str | None = None) -> Any:
        """Call ``task`` under a call id already reserved; ``label`` names it in errors."""
        args, kwargs = resolve_futures(args, kwargs)
        arguments = _bind(task.signature, args, kwargs, task.name)
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
        if value is _MISSING:
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
        if value is _MISSING:
            return None
        self._transition(record, TaskState.CACHED, output=entry["output"],
                         source_run=entry.get("run_id"))
        return (value,)

    def _transition(self, record: TaskRecord, state: TaskState, **fields: Any) -> None:
        """The one way a task's state changes: checked, stamped, saved, then announced.

        Raises:
            RuntimeError: ``state`` does not follow the record's state (a uniflow bug).
        """
        if not record.state.can_become(state):
            raise RuntimeError(
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

    def _execute(self, task: Task, record: TaskRecord, arguments: dict[str, Any],
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
                with (
                    self._output_log(log_path),
                    plugin.execution(task.config, self),
                ):
                    if elsewhere:
                        travelling = self._attempt_elsewhere(plugin, task, record, call_dir,
                                                             arguments)
                    else:
                        resolved = _resolve(task.annotations, arguments)
                        with time_limit(task.timeout, task.name):
                            value = task.fn(**resolved)
                        travelling = self._persist(record, call_dir, value)
            except Exception as exc:
                last_exc = exc
                record.error = _error_dict(exc)
                retryable = getattr(exc, "uniflow_retryable", True) and attempt <= task.retries
                if retryable:
                    self.info(f"task {record.call_id} attempt {attempt} failed "
                              f"({type(exc).__name__}: {exc}); retrying")
                    continue
                break
            except BaseException as exc:  # Ctrl-C, SystemExit: record and stop at once
                self._transition(record, TaskState.FAILED, error=_error_dict(exc))
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
        raise _summarized(_prefixed(last_exc, label), self.reporter)

    def _logs_command(self, call_id: str) -> str:
        command = f"michelangelo runs logs {self.run_id} {call_id}"
        if self.storage.url != Storage().url:
            command += f" --storage-url {self.storage.url}"
        return command

    def _persist(self, record: TaskRecord, call_dir: str, value: Any) -> Any:
        record.output, travelling = persist_value(self.storage, call_dir, record.attempts, value)
        return travelling

    def _attempt_elsewhere(self, plugin: TaskPlugin, task: Task, record: TaskRecord,
                           call_dir: str, arguments: dict[str, Any]) -> Any:
        """One attempt run by the plugin somewhere else; its result comes back via storage."""
        call = prepare_remote_call(self.storage, task, self.run_id, record.call_id,
                                   record.attempts, call_dir, arguments)
        plugin.run_elsewhere(task.config, self, call)
        for entry in read_remote_artifacts(self.storage, call):
            self.add_artifact(record.call_id, entry)
        output = read_remote_result(self.storage, call)
        value = load_output(self.storage, output)
        if value is _MISSING:
            raise RemoteTaskError(
                f"task {task.name!r}: the remote attempt reported its result at "
                f"{output['folder']}, but this machine cannot see it there. Use a storage URL "
                "both this machine and the cluster can reach."
            )
        record.output = output
        return value


_MISSING = object()


def persist_value(storage: Storage, call_dir: str, attempt: int, value: Any) -> tuple[dict, Any]:
    """Write one attempt's result atomically; return its output record and travelling value."""
    final = posixpath.join(call_dir, f"output-{attempt}")
    io, meta = write_value(storage, final, value)
    return ({"io": io.name, "folder": final, "meta": meta},
            io.travelling(value, storage, final, meta))


def load_output(storage: Storage, output: dict) -> Any:
    """The travelling value of a stored output, or ``_MISSING`` if its folder is gone."""
    io = io_named(output["io"])
    folder = output["folder"]
    if not storage.exists(folder):
        return _MISSING
    value = io.read(storage, folder, output["meta"])
    return io.travelling(value, storage, folder, output["meta"])


def resolve_futures(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Wait for the futures among a call's arguments (also inside lists, tuples and dicts)."""
    return tuple(_resolved(a) for a in args), {k: _resolved(v) for k, v in kwargs.items()}


def _resolved(value: Any) -> Any:
    if getattr(type(value), "__uniflow_future__", False):
        return value.result()
    if type(value) in (list, tuple):
        return type(value)(_resolved(v) for v in value)
    if type(value) is dict:
        return {k: _resolved(v) for k, v in value.items()}
    return value


def _bind(signature: inspect.Signature, args: tuple, kwargs: dict, name: str) -> dict[str, Any]:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}(): {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _resolve(hints: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Turn handles into what the task's annotations ask for (e.g. a Ray Dataset)."""
    resolved = {}
    for name, value in arguments.items():
        resolver = getattr(value, "uniflow_resolve", None)
        resolved[name] = resolver(hints.get(name)) if resolver else value
    return resolved


def _error_dict(exc: BaseException) -> dict:
    error = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }
    # A plugin that knows more (which worker failed, its last log lines) attaches it here.
    detail = getattr(exc, "uniflow_failure_detail", None)
    if isinstance(detail, dict):
        error["detail"] = detail
    return error


def _raiser(exc: BaseException) -> Callable[[], None]:
    def again() -> None:
        raise exc

    return again


def _summarized(exc: BaseException, reporter: Reporter) -> BaseException:
    """Mark ``exc`` as already shown to the user by a quiet console's failure summary."""
    if reporter.quiet:
        with contextlib.suppress(AttributeError, TypeError):
            exc.__uniflow_summarized__ = True
    return exc


def _prefixed(exc: BaseException, task_name: str) -> BaseException:
    """The user's own exception, its message prefixed with the task name."""
    return prefixed(exc, f"task {task_name!r} failed: ")


def prefixed(exc: BaseException, prefix: str) -> BaseException:
    """``exc`` itself (its type unchanged), its message starting with ``prefix``."""
    args = exc.args
    if args and isinstance(args[0], str):
        if not args[0].startswith(prefix):
            exc.args = (prefix + args[0], *args[1:])
    elif not args:
        exc.args = (prefix.rstrip(": "),)
    else:
        exc.add_note(prefix.rstrip(": "))
    return exc


@contextlib.contextmanager
def no_run() -> Iterator[None]:
    token = _ACTIVE_RUN.set(None)
    try:
        yield
    finally:
        _ACTIVE_RUN.reset(token)
