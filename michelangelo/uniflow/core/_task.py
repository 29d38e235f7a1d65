"""``@uniflow.task``: a function whose calls are recorded, persisted and resumable."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from typing_extensions import ParamSpec

from michelangelo.uniflow.core._fingerprint import code_fingerprint
from michelangelo.uniflow.core._plugin import find_plugin
from michelangelo.uniflow.core._run import run_callable
from michelangelo.uniflow.core._runtime import active_run
from michelangelo.uniflow.core.errors import UserError

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A decorated task. Call it inside a workflow, or directly to run it on its own."""

    def __init__(
        self,
        fn: Callable[P, R],
        config: Any = None,
        *,
        retries: int = 0,
        timeout: float | None = None,
        cache: bool = False,
        cache_version: str | None = None,
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise UserError(
                f"@uniflow.task(retries={retries!r}) on {fn.__qualname__}: retries must be a "
                "whole number >= 0, e.g. retries=2."
            )
        if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
            raise UserError(
                f"@uniflow.task(timeout={timeout!r}) on {fn.__qualname__}: timeout must be a "
                "positive number of seconds (or None for no limit), e.g. timeout=600."
            )
        if cache_version is not None and not isinstance(cache_version, str):
            raise UserError(
                f"@uniflow.task(cache_version={cache_version!r}) on {fn.__qualname__}: use a "
                "string such as cache_version='v2'."
            )
        find_plugin(config).validate(config)
        self.fn = fn
        self.config = config
        self.retries = retries
        self.timeout = timeout
        self.cache = bool(cache)
        self.cache_version = cache_version
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def identity(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    @functools.cached_property
    def code_fingerprint(self) -> str:
        return code_fingerprint(self.fn)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.fn)

    @functools.cached_property
    def annotations(self) -> dict[str, Any]:
        try:
            return inspect.get_annotations(self.fn, eval_str=True)
        except Exception:  # unresolvable annotations: handles are passed as they are
            return {}

    def with_overrides(self, **changes: Any) -> Task[P, R]:
        """A copy of this task with some options changed, e.g. ``config=RayTask(...)``."""
        options = {
            "config": self.config,
            "retries": self.retries,
            "timeout": self.timeout,
            "cache": self.cache,
            "cache_version": self.cache_version,
        }
        unknown = set(changes) - set(options)
        if unknown:
            raise UserError(
                f"{self.name}.with_overrides(): unknown option(s) {sorted(unknown)}; "
                f"valid options are {sorted(options)}."
            )
        options.update(changes)
        return Task(self.fn, **options)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        run = active_run()
        if run is not None:
            return run.call_task(self, args, kwargs)
        # Called on its own: a run of one task, with the same persistence and clean-up.
        return run_callable(self.name, lambda: self(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<uniflow task {self.identity} config={self.config!r}>"


def task(
    config: Any = None,
    *,
    retries: int = 0,
    timeout: float | None = None,
    cache: bool = False,
    cache_version: str | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Declare a uniflow task.

    Args:
        config: Where the body runs: ``None`` for the local process, or a plugin config such
            as ``RayTask(...)`` for a Ray cluster of that shape.
        retries: How many times a failed attempt is retried.
        timeout: Seconds an attempt may run before it fails with ``TaskTimeoutError``.
        cache: Reuse the result of an earlier call with the same code and inputs.
        cache_version: Bump to invalidate cached results without changing the code.

    Returns:
        A decorator turning a function into a :class:`Task`.
    """
    if callable(config) and not dataclasses.is_dataclass(config) and not isinstance(config, type):
        # Used bare as @uniflow.task without parentheses.
        return Task(config)  # type: ignore[return-value]

    def wrap(fn: Callable[P, R]) -> Task[P, R]:
        return Task(fn, config, retries=retries, timeout=timeout, cache=cache,
                    cache_version=cache_version)

    return wrap
