"""One workflow run: its lifecycle, from start to the last cleanup, and what it offers plugins.

The task calls a run makes are its call state machine (:mod:`._calls`, a mixin of
:class:`Run`); what is running now lives in :mod:`._runtime`.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import posixpath
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from michelangelo.uniflow.core._calls import TaskCalls, bind_arguments
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._failures import error_dict, raiser
from michelangelo.uniflow.core._logs import capture_output, capture_thread_output
from michelangelo.uniflow.core._records import (
    RunRecord,
    RunState,
    RunStore,
    TaskRecord,
)
from michelangelo.uniflow.core._runtime import (
    CallScope,
    active_run,
    current_call,
    current_scope,
    reset_active_run,
    set_active_run,
)
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.errors import RunNotFoundError


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


class Run(TaskCalls):
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
        scope = current_scope() or self._root_scope
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
        scope = current_scope() or self._root_scope
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
            bind_arguments(inspect.signature(fn), args, kwargs,
                           getattr(fn, "__name__", "workflow")))
        self.store.save_run(self.record)
        self.reporter.run_started(self.record)
        token = set_active_run(self)
        # Output between tasks (the workflow body, cluster teardown) has a log of its own.
        driver_log = posixpath.join(self.store.run_dir(self.run_id), "logs", "driver.log")
        outer = self._output_log(driver_log) if self.reporter.quiet else contextlib.nullcontext()
        try:
            with outer:
                value = self._body(fn, args, kwargs)
        except BaseException as exc:
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
            self.record.state = RunState.INTERRUPTED if interrupted else RunState.FAILED
            self.record.error = error_dict(exc)
            raise
        else:
            self.record.state = RunState.SUCCEEDED
            return value
        finally:
            reset_active_run(token)
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
            self._cleanups.append(raiser(exc))

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


def run_callable(name: str, body: Callable[[], Any]) -> Any:
    """Run ``body`` as a run of its own (a task or workflow called outside any context)."""
    run = Run(name, reporter=Reporter())
    return run.execute(lambda: body(), (), {})
