"""``@uniflow.workflow``: plain Python that calls tasks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from typing_extensions import ParamSpec

from michelangelo.uniflow.core._run import run_callable
from michelangelo.uniflow.core._runtime import active_run

P = ParamSpec("P")
R = TypeVar("R")


class Workflow(Generic[P, R]):
    """A decorated workflow: inside a run it is inlined, on its own it starts a run."""

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        return self.fn.__name__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if active_run() is not None:
            return self.fn(*args, **kwargs)
        return run_callable(self.name, lambda: self.fn(*args, **kwargs))


def workflow() -> Callable[[Callable[P, R]], Workflow[P, R]]:
    """Declare a uniflow workflow: a function that chains task calls."""

    def wrap(fn: Callable[P, R]) -> Workflow[P, R]:
        return Workflow(fn)

    return wrap


def unwrap(fn: Any) -> Callable[..., Any]:
    return fn.fn if isinstance(fn, Workflow) else fn
