"""Keyword arguments checked against the signature of the callable that will receive them.

The trainer calls two things far from the driver with user-supplied keywords:
``create_model_fn(**create_model_fn_kwargs)`` and ``pytorch_lightning.Trainer(**kwargs)``.
A typo there is a ``TypeError`` on every worker after a cluster started; checked against the
signature here, it is one line on the driver that names the key and the closest valid name.

:func:`matches` and :func:`describe` read the annotations of a signature, so a value of the
wrong type can be refused with the callee's own declared types instead of a copied table.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from michelangelo.errors import InputError

__all__ = ["check_kwargs", "closest", "describe", "matches", "signature_of"]

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_LIST_AT_MOST = 12  # beyond this, listing every valid name hides the message


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(fn)``, or None when Python cannot tell (some builtins, C types)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate spelled most like ``name`` (difflib ratio >= 0.6), if any."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def check_kwargs(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    *,
    label: str,
    target: str,
    extra_names: Iterable[str] = (),
) -> None:
    """Raise ValueError unless ``fn(**kwargs)`` binds.

    Args:
        fn: The callable that will receive ``kwargs``.
        kwargs: The keyword arguments the user gave.
        label: How the user wrote the dict, e.g. ``"create_model_fn_kwargs"``.
        target: How to name ``fn`` in the message, e.g. ``"pytorch_lightning.Trainer"``.
        extra_names: Keys that are valid although ``fn`` does not take them (they are
            consumed before the call).

    Raises:
        ValueError: A key is not a string, ``fn`` takes no such keyword (the closest valid
            name is suggested), or a required parameter is missing.
    """
    signature = signature_of(fn)
    if signature is None:
        return
    params = signature.parameters
    extra = set(extra_names)
    for key in kwargs:
        if not isinstance(key, str):
            raise InputError(f"{label} has the key {key!r}, but keyword names must be strings. "
                             f"Fix: use the parameter name of {target} as a string.")
    accepted = [n for n, p in params.items() if p.kind in _KEYWORD_KINDS] + sorted(extra)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_any:
        unknown = [k for k in kwargs if k not in accepted]
        if unknown:
            raise InputError(_unknown_message(unknown, accepted, label, target))
    required = [n for n, p in params.items()
                if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    positional_only = [n for n in required
                       if params[n].kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        raise InputError(
            f"{target} requires the positional-only parameter(s) {positional_only}, which "
            f"{label} cannot fill (it is passed as keywords). Fix: give {target} keyword "
            "parameters, or bind them with functools.partial."
        )
    missing = [n for n in required if n not in kwargs]
    if missing:
        example = ", ".join(f"{n!r}: ..." for n in missing)
        raise InputError(
            f"{label} lacks {', '.join(map(repr, missing))}, required by {target}, which is "
            f"called with {label} as its keywords. Fix: add {{{example}}} to {label}, or give "
            "the parameter a default."
        )


def _unknown_message(unknown: list[str], accepted: list[str], label: str, target: str) -> str:
    takes = (f" It takes: {', '.join(accepted)}." if len(accepted) <= _LIST_AT_MOST
             else f" See {target}'s signature for the names it takes.")
    if len(unknown) == 1:
        key = unknown[0]
        suggestion = closest(key, accepted)
        if suggestion:
            return (f"{label}[{key!r}] is not a parameter of {target}; did you mean "
                    f"{suggestion!r}?{takes} Fix: rename {key!r} to {suggestion!r}.")
        return (f"{label}[{key!r}] is not a parameter of {target}.{takes} Fix: remove it or "
                "use a parameter it takes.")
    parts = []
    for key in unknown:
        suggestion = closest(key, accepted)
        parts.append(f"{key!r} (did you mean {suggestion!r}?)" if suggestion else repr(key))
    return (f"{label} has keys that are not parameters of {target}: {', '.join(parts)}."
            f"{takes} Fix: rename or remove them.")


def matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation``; True for anything this cannot judge.

    Understands classes, ``None``, ``Union``/``Optional``/``X | Y``, ``Literal`` and the
    containers ``list[X]``, ``tuple[X, ...]``, ``dict[K, V]``, ``Iterable[X]`` (elements
    checked for ``list``/``tuple``/``Iterable``). ``int`` refuses ``bool``; ``float`` takes
    any real number except ``bool``. Type variables, callables, protocols and string
    annotations are not judged.
    """
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(matches(value, arm) for arm in args)
    if origin is typing.Literal:
        # Equality like Lightning's own ``in`` test, but True is not the literal 1.
        return any(value == arg and isinstance(value, bool) == isinstance(arg, bool)
                   for arg in args)
    if origin is not None:
        return _matches_generic(value, origin, args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _matches_generic(value: Any, origin: Any, args: tuple[Any, ...]) -> bool:
    if origin is collections.abc.Callable:
        return callable(value)
    if not isinstance(origin, type) or not isinstance(value, origin):
        return False
    if isinstance(value, str | bytes | dict) or not args:
        return True  # strings are iterables of themselves; dict values are not judged
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return True
    try:
        items = list(value)
    except TypeError:
        return True
    return all(matches(item, args[0]) for item in items)


def describe(annotation: Any) -> str:
    """A short reading of ``annotation`` for a message: ``int or None``, ``one of 'a', 'b'``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        literals = [a for arm in args if typing.get_origin(arm) is typing.Literal
                    for a in typing.get_args(arm)]
        others = [describe(arm) for arm in args if typing.get_origin(arm) is not typing.Literal]
        words = ([f"one of {', '.join(map(repr, literals))}"] if literals else []) + others
        return " or ".join(words)
    if origin is typing.Literal:
        return f"one of {', '.join(map(repr, args))}"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(describe(a) for a in args)}]" if args else name
    return getattr(annotation, "__name__", str(annotation))
