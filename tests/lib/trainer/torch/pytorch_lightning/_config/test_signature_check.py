"""Keyword arguments against a signature; values against its annotations."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable
from typing import Any, Literal, Optional

import pytest

from michelangelo.lib.trainer.torch.pytorch_lightning._config._signature_check import (
    check_kwargs,
    closest,
    describe,
    matches,
)


def factory(hidden_dim: int = 8, *, lr: float = 1e-3):
    return hidden_dim, lr


def needs_path(path, hidden_dim=8):
    return path, hidden_dim


def open_ended(hidden_dim=8, **kwargs):
    return hidden_dim, kwargs


def positional_only(path, /, hidden_dim=8):
    return path, hidden_dim


class Model:
    def __init__(self, width: int, depth: int = 2):
        self.width, self.depth = width, depth


def check(fn, kwargs, **extra):
    check_kwargs(fn, kwargs, label="create_model_fn_kwargs", target="the factory", **extra)


def test_accepted_calls():
    check(factory, {})
    check(factory, {"hidden_dim": 3, "lr": 0.1})
    check(needs_path, {"path": "/w"})
    check(open_ended, {"anything": 1, "at_all": 2})  # **kwargs takes every key
    check(Model, {"width": 4})  # a class: its __init__ without self
    check(functools.partial(needs_path, "/w"), {"hidden_dim": 2})
    check(factory, {"sibling": 1}, extra_names=("sibling",))


@pytest.mark.parametrize(
    ("fn", "kwargs", "fragments"),
    [
        (factory, {"hiden_dim": 3}, ["create_model_fn_kwargs['hiden_dim'] is not a parameter",
                                     "did you mean 'hidden_dim'?", "It takes: hidden_dim, lr",
                                     "Fix: rename 'hiden_dim' to 'hidden_dim'"]),
        (factory, {"zzz": 1}, ["['zzz'] is not a parameter", "Fix: remove it"]),
        (factory, {"hiden_dim": 3, "learning_rate": 1},
         ["'hiden_dim' (did you mean 'hidden_dim'?)", "'learning_rate'", "rename or remove"]),
        (needs_path, {"hidden_dim": 3}, ["lacks 'path'", "Fix: add {'path': ...}"]),
        (Model, {}, ["lacks 'width'"]),
        (positional_only, {"hidden_dim": 2}, ["positional-only parameter(s) ['path']",
                                               "functools.partial"]),
        (factory, {1: 2}, ["has the key 1", "must be strings"]),
    ],
)
def test_refused_calls_name_the_key_and_the_fix(fn, kwargs, fragments):
    with pytest.raises(ValueError) as info:
        check(fn, kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_closest_needs_a_real_resemblance():
    assert closest("max_epoch", ["max_epochs", "min_epochs", "max_steps"]) == "max_epochs"
    assert closest("learning_rate", ["max_epochs", "precision"]) is None


PRECISION = Literal[64, 32, 16] | Literal["16-mixed", "bf16-mixed"] | None


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        (3, Optional[int], True),  # noqa: UP045 - Lightning's annotations use typing.Union
        (None, int | None, True),
        ("3", int | None, False),
        (1.5, int | None, False),
        (True, int, False),  # a bool is not a count
        (2, float, True),
        (True, float, False),
        (True, int | bool, True),
        ("bf16-mixed", PRECISION, True),
        (16, PRECISION, True),
        ("17", PRECISION, False),
        (True, Literal[1], False),
        ([1, 2], list[int], True),
        ([1, "x"], list[int], False),
        ((1, 2), list[int], False),
        ("ab", Iterable[int], True),  # a string is not judged element by element
        ([1, 2], Iterable[int], True),
        (datetime.timedelta(1), str | datetime.timedelta | dict[str, int] | None, True),
        ({"hours": 1}, str | datetime.timedelta | dict[str, int] | None, True),
        (3, str | datetime.timedelta | dict[str, int] | None, False),
        (object(), Any, True),
        (object(), "SomeForwardRef", True),  # string annotations are not judged
        (3, int | None, True),
        ("x", int | None, False),
    ],
)
def test_matches(value, annotation, expected):
    assert matches(value, annotation) is expected


def test_describe_reads_like_a_sentence():
    assert describe(Optional[int]) == "int or None"  # noqa: UP045 - as Lightning writes it
    assert describe(PRECISION) == "one of 64, 32, 16, '16-mixed', 'bf16-mixed' or None"
    assert describe(list[int] | str) == "list[int] or str"
