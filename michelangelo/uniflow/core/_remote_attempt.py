"""One task attempt run by another process, possibly on another machine: the remote side.

:func:`execute_remote_call` runs one attempt that the driver described in a
:class:`~._remote.RemoteCall` (see :mod:`._remote`, the driver's side) and writes its result
file. It loads the task function from its source file, so it sits above the task module.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from michelangelo.uniflow.core._fingerprint import code_fingerprint
from michelangelo.uniflow.core._plugin import find_plugin
from michelangelo.uniflow.core._remote import _MAIN_ALIAS, _RESULT_FAILED, _RESULT_OK, RemoteCall
from michelangelo.uniflow.core._runtime import CallInfo, reset_current_call, set_current_call
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core._task import Task
from michelangelo.uniflow.core._timeout import time_limit
from michelangelo.uniflow.core._values import persist_value, read_value, resolve_handles
from michelangelo.uniflow.core.errors import RemoteTaskError


def execute_remote_call(
    call: RemoteCall,
    *,
    source_file: str | None = None,
    on_module_loaded: Callable[[Any, bool], None] | None = None,
    around: Callable[[Any], contextlib.AbstractContextManager[None]] | None = None,
) -> bool:
    """Run one attempt described by ``call`` here and write its result file.

    Args:
        call: The description the driver stored.
        source_file: Where the task's source file is on this machine (default: the driver's
            path).
        on_module_loaded: Called with ``(module, loaded_from_file)`` once the task's module is
            imported (the Ray plugin registers file-loaded modules for pickling by value).
        around: Given the task config, a context manager wrapping the body (the Ray plugin
            connects to the cluster and activates the RayTask's capacity check there).

    Returns:
        Whether the task succeeded; its error, if any, is in the result file.
    """
    storage = Storage(call.storage_url)
    info = CallInfo(call.run_id, call.call_id, call.task_name, call.attempt, storage,
                    call.call_dir, artifacts=[])
    token = set_current_call(info)
    try:
        fn, annotations = _load_function(call, source_file or call.source_file, on_module_loaded)
        config = call.build_config()
        find_plugin(config).check_body(config, fn)
        arguments = {name: read_value(storage, output) for name, output in call.inputs.items()}
        with around(config) if around is not None else contextlib.nullcontext():
            resolved = resolve_handles(annotations, arguments)
            with time_limit(call.timeout, call.task_name):
                value = fn(**resolved)
            output, _ = persist_value(storage, call.call_dir, call.attempt, value)
    except Exception as exc:
        traceback.print_exc()
        storage.write_json(call.result_path, {"state": _RESULT_FAILED, "error": _describe(exc),
                                              "artifacts": _plain(info.artifacts)})
        return False
    finally:
        reset_current_call(token)
    storage.write_json(call.result_path, {"state": _RESULT_OK, "output": output,
                                          "artifacts": _plain(info.artifacts)})
    return True


def _plain(artifacts: list[dict] | None) -> list[dict]:
    """Artifacts as JSON (a value JSON cannot hold becomes its text, not a lost result)."""
    return json.loads(json.dumps(artifacts or [], default=str))


def _load_function(call: RemoteCall, source_file: str,
                   on_module_loaded: Callable[[Any, bool], None] | None) -> tuple[Callable, dict]:
    module, from_file = _import_module(call.module, source_file)
    if on_module_loaded is not None:
        on_module_loaded(module, from_file)
    target: Any = module
    for part in call.qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise RemoteTaskError(
                f"task {call.task_name!r}: {source_file} has no {call.qualname!r}; the code "
                "sent to the cluster differs from the code the workflow ran with."
            )
    task = target
    fn = getattr(task, "fn", task)
    if code_fingerprint(fn) != call.code_fingerprint:
        raise RemoteTaskError(
            f"task {call.task_name!r}: the code of {call.qualname} in {source_file} differs from "
            "the code the workflow ran with (the project folder sent to the cluster is stale). "
            "Save your changes and run again."
        )
    annotations = task.annotations if isinstance(task, Task) else {}
    return fn, annotations


def _import_module(name: str, source_file: str) -> tuple[Any, bool]:
    """Import the task's module by name where it is importable, else from its file."""
    if name != "__main__" and not name.startswith("uniflow_user_"):
        try:
            return importlib.import_module(name), False
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    alias = _MAIN_ALIAS if name == "__main__" else name
    if alias in sys.modules:
        return sys.modules[alias], True
    spec = importlib.util.spec_from_file_location(alias, source_file)
    if spec is None or spec.loader is None:
        raise RemoteTaskError(f"cannot import the task's file {source_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(source_file)))
    spec.loader.exec_module(module)
    return module, True


def _describe(exc: BaseException) -> dict:
    args: list | None = list(exc.args)
    try:
        json.dumps(args)
    except (TypeError, ValueError):
        args = None
    klass = type(exc)
    # The remote side imports a script under another name than __main__; the driver knows
    # the script's classes as __main__.*.
    module = "__main__" if klass.__module__ == _MAIN_ALIAS else klass.__module__
    return {
        "type": klass.__name__,
        "class": f"{module}:{klass.__qualname__}",
        "message": str(exc)[:2000],
        "args": args,
        "retryable": bool(getattr(exc, "uniflow_retryable", True)),
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }
