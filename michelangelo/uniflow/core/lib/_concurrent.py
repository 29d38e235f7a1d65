"""Concurrent branches of a run: futures, batches and the threads that run them.

Each branch runs in a thread of the driver. A branch that is a task call is recorded like
any other call (attempts, retries, timeout, cache, log) under an id reserved when the batch
is submitted, in call order (``003-train[2]``), so ids never depend on completion order and
``--resume`` finds every succeeded branch again. How many branches run at once is the
smallest of ``max_concurrency`` and what each plugin says its branches can share
(:meth:`TaskPlugin.plan_concurrency`); the batch prints and records that decision.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from michelangelo.errors import InputTypeError
from michelangelo.uniflow.core import Task
from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.core.plugin import (
    Run,
    TaskRecord,
    TaskState,
    active_run,
    call_scope,
    find_plugin,
    interrupt_thread,
    prefixed,
    resolve_futures,
    wait_awake,
)

T = TypeVar("T")

CancelledError = concurrent.futures.CancelledError


def _stop_wait_s() -> float:
    """How long a stop waits for running branches to end before the run moves on."""
    return float(os.environ.get("UF_BRANCH_STOP_S", "10"))


class Future(Generic[T]):
    """The result of a branch that runs concurrently; pass it to a task call as a value."""

    __uniflow_future__ = True  # task calls wait for futures among their arguments

    def __init__(self, label: str) -> None:
        self.label = label
        self._event = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._seen = False  # whether anyone asked for the outcome

    def done(self) -> bool:
        """Whether the branch has ended (succeeded, failed or cancelled)."""
        return self._event.is_set()

    def cancelled(self) -> bool:
        """Whether the branch was cancelled before it started."""
        return isinstance(self._error, CancelledError)

    def result(self, timeout: float | None = None) -> T:
        """Wait for the branch and return its value.

        Args:
            timeout: Seconds to wait; ``None`` waits as long as the branch runs.

        Returns:
            What the branch returned.

        Raises:
            TimeoutError: The branch was still running after ``timeout`` seconds.
            concurrent.futures.CancelledError: The branch was cancelled before it started.
            Exception: The branch's own exception, its message starting with the task name
                and branch index.
        """
        if not _wait(self._event, timeout):
            raise TimeoutError(f"{self.label} was still running after waiting {timeout:g}s.")
        self._seen = True
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the branch; its error, or None if it succeeded."""
        if not _wait(self._event, timeout):
            raise TimeoutError(f"{self.label} was still running after waiting {timeout:g}s.")
        self._seen = True
        return self._error

    def _settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._event.set()

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        return f"<Future {self.label} {state}>"


class BatchFuture(Generic[T]):
    """The futures of one :func:`batch_run`, in the order the callables were given."""

    def __init__(self, futures: list[Future[T]]) -> None:
        self._futures = futures

    def is_ready(self) -> bool:
        """Whether every branch has ended."""
        return all(f.done() for f in self._futures)

    def get(self, timeout: float | None = None) -> list[T]:
        """Wait for every branch and return their values in order.

        Every branch settles first (none is cancelled unless the batch is ``fail_fast``);
        then the first failure in branch order is raised.

        Args:
            timeout: Seconds to wait for all branches together; ``None`` waits.

        Raises:
            TimeoutError: Some branch was still running after ``timeout`` seconds.
            Exception: The first failed branch's own exception.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for future in self._futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not _wait(future._event, left):
                raise TimeoutError(
                    f"{future.label} was still running after waiting {timeout:g}s.")
        for future in self._futures:
            future._seen = True
        failed = [f for f in self._futures if f._error is not None]
        real = [f for f in failed if not f.cancelled()]
        if real or failed:
            raise (real or failed)[0]._error  # type: ignore[misc]
        return [f._value for f in self._futures]

    def get_futures(self) -> list[Future[T]]:
        """The branches' futures, in the order the callables were given."""
        return list(self._futures)


@dataclass
class BranchCall:
    """A callable with its arguments, made by :func:`new_callable`, run later by a batch."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


@dataclass
class _Branch:
    index: int | None  # None for a lone concurrent.run
    call: BranchCall
    label: str
    call_id: str | None  # reserved for a task call
    scope: str  # prefix of the calls a non-task branch makes itself
    context: contextvars.Context
    future: Future
    thread: threading.Thread | None = None


class _Batch:
    """Runs branches in threads, at most ``limit`` at once, in the order given."""

    def __init__(self, run: Run | None, branches: list[_Branch], limit: int,
                 fail_fast: bool) -> None:
        self.run = run
        self.limit = limit
        self.fail_fast = fail_fast
        self._branches = list(branches)
        self._pending = collections.deque(branches)
        self._running: list[_Branch] = []
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self._left = len(branches)

    def start(self) -> None:
        if self.run is not None:
            self.run.concurrency_changed(+1)
            self.run.track_batch(self)
        self._pump()

    def _pump(self) -> None:
        with self._lock:
            while self._pending and len(self._running) < self.limit:
                branch = self._pending.popleft()
                branch.thread = threading.Thread(
                    target=branch.context.run, args=(self._run_branch, branch), daemon=True,
                    name=f"uniflow-branch-{branch.call_id or branch.label}")
                self._running.append(branch)
                branch.thread.start()

    def _run_branch(self, branch: _Branch) -> None:
        try:
            value = _execute(self.run, branch)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            branch.future._settle(error=exc)
            if self.fail_fast:
                self.cancel_pending(f"{branch.label} failed and the batch is fail_fast")
        else:
            branch.future._settle(value)
        finally:
            with self._lock:
                self._running.remove(branch)
            self._branch_ended()
            self._pump()

    def _branch_ended(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            if self.run is not None:
                self.run.concurrency_changed(-1)
            self._all_done.set()

    def cancel_pending(self, why: str) -> None:
        """Settle every branch that has not started as cancelled."""
        with self._lock:
            cancelled = list(self._pending)
            self._pending.clear()
        for branch in cancelled:
            error = CancelledError(f"{branch.label} was cancelled before it started: {why}.")
            if self.run is not None and branch.call_id is not None:
                self.run.store.save_task(self.run.run_id, TaskRecord(
                    call_id=branch.call_id, task_name=_name(branch.call.fn),
                    state=TaskState.PENDING, error={"type": "CancelledError",
                                                    "message": str(error)}))
            branch.future._settle(error=error)
            self._branch_ended()

    def wait(self) -> None:
        """Block until every branch has ended; warn of failures nobody asked about."""
        _wait(self._all_done, None)
        for branch in self._branches:
            future = branch.future
            if future._error is not None and not future._seen and self.run is not None:
                self.run.warn(f"{future.label} failed and the workflow never asked for its "
                              f"result: {type(future._error).__name__}: {future._error}")

    def stop(self) -> None:
        """Start nothing more; interrupt running branches; wait a bounded time for them."""
        self.cancel_pending("the run is stopping")
        with self._lock:
            running = [b for b in self._running if b.thread is not None]
        for branch in running:
            if branch.thread.ident is not None and branch.thread.is_alive():
                interrupt_thread(branch.thread.ident, KeyboardInterrupt)
        deadline = time.monotonic() + _stop_wait_s()
        for branch in running:
            branch.thread.join(max(0.0, deadline - time.monotonic()))


def _wait(event: threading.Event, timeout: float | None) -> bool:
    """``event.wait(timeout)``, awake: the kernel may hand a Ctrl-C to any thread of the process
    (a branch thread inside Ray's C++ calls, say), and the workflow's thread only raises it once
    its wait returns, which an unbounded wait on a branch that runs forever never does."""
    return wait_awake(event.wait, timeout) or event.is_set()


def _execute(run: Run | None, branch: _Branch) -> Any:
    call = branch.call
    if run is None:
        args, kwargs = resolve_futures(call.args, call.kwargs)
        return call.fn(*args, **kwargs)
    if isinstance(call.fn, Task) and branch.call_id is not None:
        # Calls the task body makes itself are numbered under the branch's own id.
        with call_scope(f"{branch.call_id}."):
            return run.call_task_as(call.fn, branch.call_id, call.args, call.kwargs,
                                    label=branch.label)
    with call_scope(branch.scope):
        try:
            args, kwargs = resolve_futures(call.args, call.kwargs)
            return call.fn(*args, **kwargs)
        except Exception as exc:
            raise prefixed(exc, f"branch {branch.label} failed: ") from None


def _name(fn: Any) -> str:
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _as_call(item: Any, position: int) -> BranchCall:
    if isinstance(item, BranchCall):
        return item
    if callable(item):
        return BranchCall(item)
    raise InputTypeError(
        f"batch_run(callables=...): item {position} is {item!r}, which is not callable. "
        "Make each item with concurrent.new_callable(fn, *args, **kwargs)."
    )


def _check_limit(max_concurrency: Any) -> None:
    if max_concurrency is None:
        return
    if (isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
            or max_concurrency < 1):
        raise UserError(
            f"batch_run(max_concurrency={max_concurrency!r}): use a whole number >= 1 (how many "
            "branches may run at once), or None for as many as the plugins allow."
        )


def submit(items: Iterable[Any], *, max_concurrency: int | None, fail_fast: bool,
           indexed: bool) -> list[Future]:
    """Start the branches of a batch (``indexed``) or one lone branch; return their futures."""
    _check_limit(max_concurrency)
    calls = [_as_call(item, i) for i, item in enumerate(items)]
    run = active_run()
    branches: list[_Branch] = []
    prefix, number = run.next_sequence() if run is not None else ("", 0)
    for i, call in enumerate(calls):
        index = i if indexed else None
        name = _name(call.fn)
        label = f"{name}[{i}]" if indexed else name
        call_id = None
        if run is not None and isinstance(call.fn, Task):
            call_id = run.reserve_call_id(call.fn.name, branch=index, sequence=number)
        scope = f"{prefix}{number:03d}" + (f"[{i}]" if indexed else "") + "."
        # Each branch starts from a copy of the submitter's context (the run, its plugins).
        branches.append(_Branch(index, call, label, call_id, scope, contextvars.copy_context(),
                                Future(f"task {label!r}" if call_id else f"branch {label}")))
    limit = _plan(run, branches, number, prefix, max_concurrency) if indexed else 1
    if not branches:
        return []
    _Batch(run, branches, limit, fail_fast).start()
    return [b.future for b in branches]


def _plan(run: Run | None, branches: list[_Branch], number: int, prefix: str,
          max_concurrency: int | None) -> int:
    """How many branches run at once, and the one line that says why (printed, recorded)."""
    limit = max(1, len(branches))
    why = [f"max_concurrency={max_concurrency}"]
    if max_concurrency is not None:
        limit = min(limit, max_concurrency)
    if run is None or not branches:
        return limit
    by_plugin: dict[int, tuple[Any, list[Any]]] = {}
    for branch in branches:
        if isinstance(branch.call.fn, Task):
            plugin = find_plugin(branch.call.fn.config)
            by_plugin.setdefault(id(plugin), (plugin, []))[1].append(branch.call.fn.config)
    for plugin, configs in by_plugin.values():
        allowed, reason = plugin.plan_concurrency(configs, run)
        if reason:
            why.append(reason)
        if allowed is not None:
            limit = min(limit, max(1, allowed))
    names = sorted({_name(b.call.fn) for b in branches})
    batch = f"{prefix}{number:03d}"
    line = (f"batch {batch}: {len(branches)} branch(es) of {', '.join(names)}, "
            f"{limit} at once ({'; '.join(why)})")
    run.info(line)
    run.record_batch({"batch": batch, "branches": len(branches), "at_once": limit,
                      "why": why, "tasks": names})
    return limit
