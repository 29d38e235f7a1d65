"""Load ``FILE:WORKFLOW`` and parse ``--arg k=v`` values."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

from michelangelo.uniflow.core.errors import UserError


def load_target(target: str) -> Any:
    """Import the file and return the named workflow (or task)."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise UserError(
            f"{target!r} is not FILE:WORKFLOW; write e.g. examples/quickstart/workflow.py:main"
        )
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UserError(f"workflow file {path!r} does not exist")
    module_name = "uniflow_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, os.path.dirname(path))
    spec.loader.exec_module(module)
    # Ray workers cannot import a module loaded from a file path: send its code by value.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(module)
    if not hasattr(module, name):
        found = sorted(n for n, v in vars(module).items() if hasattr(v, "fn") and callable(v))
        raise UserError(f"{path} has no {name!r}; workflows and tasks there: {found or 'none'}")
    return getattr(module, name)


def parse_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("n=3", "name=abc")`` -> ``{"n": 3, "name": "abc"}`` (JSON values where they parse)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"--arg {pair!r} is not KEY=VALUE; write e.g. --arg n_rows=1000")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
