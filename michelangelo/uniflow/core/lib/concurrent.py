"""Run task calls side by side inside a workflow.

Typical use::

    from michelangelo.uniflow.core.lib import concurrent

    @uniflow.workflow()
    def sweep(rates: list[float]) -> str:
        batch = concurrent.batch_run(
            [concurrent.new_callable(train, lr) for lr in rates], max_concurrency=2)
        scores = batch.get()  # waits for every branch; raises the first failure
        best = concurrent.run(pick_best, scores)
        return deploy(best)  # a Future argument is waited for first

Each branch that is a task call has its own record, attempts, retries, timeout, cache and
log, named ``003-train[2]`` (the batch's call number, the task, the branch index). Ordinary
task calls stay synchronous.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from michelangelo.uniflow.core.lib._concurrent import (
    BatchFuture,
    BranchCall,
    CancelledError,
    Future,
    submit,
)

T = TypeVar("T")


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """Start ``fn(*args, **kwargs)`` in the background and return its future at once.

    Args:
        fn: A task (recorded as a call of its own) or any callable.
        *args: Positional arguments; futures among them are waited for first.
        **kwargs: Keyword arguments; futures among them are waited for first.

    Returns:
        A :class:`Future` whose ``result()`` is what ``fn`` returned.
    """
    return submit([BranchCall(fn, args, kwargs)], max_concurrency=None, fail_fast=False,
                  indexed=False)[0]


def new_callable(fn: Callable[..., T], *args: Any, **kwargs: Any) -> BranchCall:
    """``fn`` with its arguments, to hand to :func:`batch_run` (nothing runs yet)."""
    return BranchCall(fn, args, kwargs)


def batch_run(
    callables: Iterable[Callable[[], Any]],
    max_concurrency: int | None = None,
    fail_fast: bool = False,
) -> BatchFuture:
    """Run the callables as concurrent branches and return their futures together.

    Before any branch starts, one line says how many run at once and why (the
    ``max_concurrency``, and for RayTask branches the cluster's free CPUs and memory and the
    branches' shape); the run keeps that line for its report.

    Args:
        callables: Made by :func:`new_callable` (or any callable taking no arguments).
        max_concurrency: At most this many branches in flight; ``None`` leaves it to the
            plugins (a Ray cluster's free CPUs, say).
        fail_fast: When a branch fails, cancel the branches that have not started yet.
            By default every branch runs to its end.

    Returns:
        A :class:`BatchFuture` over the branches, in the order given.

    Raises:
        ValueError: ``max_concurrency`` is not a whole number >= 1.
        TypeError: An item of ``callables`` is not callable.
    """
    futures = submit(list(callables), max_concurrency=max_concurrency, fail_fast=fail_fast,
                     indexed=True)
    return BatchFuture(futures)


__all__ = ["BatchFuture", "CancelledError", "Future", "batch_run", "new_callable", "run"]
