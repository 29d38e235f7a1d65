"""One task attempt run by another process, possibly on another machine, through storage.

A plugin that runs task bodies elsewhere (the Ray plugin's Jobs API dispatch, say) gets a
:class:`RemoteCall`: a JSON description of the call saved in the call's folder. The remote side
calls :func:`execute_remote_call`, which loads the task function from its source file, reads the
inputs the driver stored, runs the body under the same time limit, persists the result with the
same IO registry and writes a small result file; the driver then reads that file back with
:func:`read_remote_result`. Retries, caching and resume stay on the driver, as for local calls.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import posixpath
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from michelangelo.uniflow.core._fingerprint import code_fingerprint
from michelangelo.uniflow.core._io import io_named, write_value
from michelangelo.uniflow.core._runtime import CallInfo, reset_current_call, set_current_call
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core._timeout import time_limit
from michelangelo.uniflow.core.errors import RemoteTaskError, UserError

if TYPE_CHECKING:
    from michelangelo.uniflow.core._task import Task

_MAIN_ALIAS = "__uniflow_main__"  # a script's module name when imported on the remote side
_RESULT_OK = "succeeded"
_RESULT_FAILED = "failed"


@dataclass
class RemoteCall:
    """Everything the remote side needs to run one attempt of one task call (JSON-able)."""

    run_id: str
    call_id: str
    task_name: str
    module: str  # the function's __module__ on the driver ("__main__" for a script)
    qualname: str
    source_file: str  # absolute path of the function's file on the driver
    code_fingerprint: str
    attempt: int
    timeout: float | None
    storage_url: str
    call_dir: str
    inputs: dict[str, dict] = field(default_factory=dict)  # name -> {"io", "folder", "meta"}
    config: dict | None = None  # {"class": "module:qualname", "fields": {...}} of a dataclass

    @property
    def attempt_dir(self) -> str:
        return posixpath.join(self.call_dir, f"remote-{self.attempt}")

    @property
    def spec_path(self) -> str:
        return posixpath.join(self.attempt_dir, "call.json")

    @property
    def result_path(self) -> str:
        return posixpath.join(self.attempt_dir, "result.json")

    def save(self, storage: Storage) -> None:
        storage.write_json(self.spec_path, asdict(self))

    @classmethod
    def load(cls, storage: Storage, path: str) -> RemoteCall:
        return cls(**storage.read_json(path))

    def build_config(self) -> Any:
        """The task's config object, rebuilt from its class and fields."""
        if self.config is None:
            return None
        klass = _import_attribute(self.config["class"], import_modules=True)
        return klass(**self.config["fields"])


# -- the driver side ------------------------------------------------------------------------
def prepare_remote_call(storage: Storage, task: Task, run_id: str, call_id: str,
                        attempt: int, call_dir: str, arguments: dict[str, Any]) -> RemoteCall:
    """Store the call's inputs (once per call) and its description; return the description."""
    fn = task.fn
    if "<locals>" in fn.__qualname__:
        raise UserError(
            f"task {task.name!r} is defined inside a function ({fn.__qualname__}); a task that "
            "runs on a remote cluster must be defined at module level so the cluster can import it."
        )
    source = _source_file(fn)
    call = RemoteCall(
        run_id=run_id,
        call_id=call_id,
        task_name=task.name,
        module=fn.__module__,
        qualname=fn.__qualname__,
        source_file=source,
        code_fingerprint=task.code_fingerprint,
        attempt=attempt,
        timeout=task.timeout,
        storage_url=storage.url,
        call_dir=call_dir,
        inputs=_store_inputs(storage, call_dir, arguments),
        config=_describe_config(task.config),
    )
    call.save(storage)
    return call


def read_remote_result(storage: Storage, call: RemoteCall) -> dict:
    """The stored output of a finished remote attempt, or raise the error it failed with.

    Raises:
        RemoteTaskError: When the remote side wrote no result at all.
        Exception: The task's own exception type when it can be rebuilt on this side.
    """
    result = storage.try_read_json(call.result_path)
    if result is None:
        raise RemoteTaskError(
            f"task {call.task_name!r} attempt {call.attempt} left no result at "
            f"{storage.url_of(call.result_path)}. Either the remote process died before the "
            "task finished, or it cannot reach this storage: use a storage URL both this "
            "machine and the cluster can reach (--storage-url s3://..., or a shared folder)."
        )
    if result["state"] == _RESULT_OK:
        return result["output"]
    raise rebuild_error(result["error"])


def read_remote_artifacts(storage: Storage, call: RemoteCall) -> list[dict]:
    """What the remote attempt passed to ``record_artifact`` (none when it left no result)."""
    result = storage.try_read_json(call.result_path) or {}
    return [a for a in result.get("artifacts") or [] if isinstance(a, dict) and "kind" in a]


def rebuild_error(error: dict) -> Exception:
    """The remote exception as its own type where this process already knows that type.

    Nothing is unpickled: the class is looked up among modules already imported here and built
    from the JSON-able ``args``; otherwise a :class:`RemoteTaskError` carries type and message.
    """
    exc: Exception | None = None
    klass = _import_attribute(error.get("class", ""), import_modules=False)
    if isinstance(klass, type) and issubclass(klass, Exception):
        with contextlib.suppress(Exception):
            args = error.get("args")
            exc = klass(*args) if args is not None else klass(error["message"])
    if exc is None:
        exc = RemoteTaskError(f"{error['type']}: {error['message']}")
    exc.uniflow_retryable = bool(error.get("retryable", True))  # type: ignore[attr-defined]
    exc.add_note("remote traceback (most recent call last):\n"
                 + error.get("traceback", "").rstrip())
    return exc


# -- the remote side ------------------------------------------------------------------------
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
    # Imported here: the run module imports this one.
    from michelangelo.uniflow.core._run import _resolve, persist_value

    storage = Storage(call.storage_url)
    info = CallInfo(call.run_id, call.call_id, call.task_name, call.attempt, storage,
                    call.call_dir, artifacts=[])
    token = set_current_call(info)
    try:
        fn, annotations = _load_function(call, source_file or call.source_file, on_module_loaded)
        config = call.build_config()
        arguments = {name: _load(storage, output) for name, output in call.inputs.items()}
        with around(config) if around is not None else contextlib.nullcontext():
            resolved = _resolve(annotations, arguments)
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


# -- helpers -------------------------------------------------------------------------------
def _source_file(fn: Callable) -> str:
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None) or getattr(fn.__code__, "co_filename", None)
    if not path or not os.path.isfile(path):
        raise UserError(
            f"task {fn.__name__!r}: its source file is unknown (defined in {fn.__module__!r}), "
            "so a remote cluster cannot import it. Define the task in a .py file."
        )
    return os.path.abspath(path)


def _describe_config(config: Any) -> dict | None:
    if config is None:
        return None
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise UserError(
            f"config={config!r}: only dataclass task configs can travel to a remote cluster."
        )
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    try:
        json.dumps(fields)
    except TypeError as exc:
        raise UserError(f"config={config!r} has a field that is not JSON-able: {exc}") from None
    klass = type(config)
    return {"class": f"{klass.__module__}:{klass.__qualname__}", "fields": fields}


def _store_inputs(storage: Storage, call_dir: str, arguments: dict[str, Any]) -> dict[str, dict]:
    """Write the call's arguments once per call (every attempt reads the same inputs)."""
    index = posixpath.join(call_dir, "inputs.json")
    stored = storage.try_read_json(index)
    if stored is not None:
        return stored
    out = {}
    for name, value in arguments.items():
        final = posixpath.join(call_dir, "inputs", name)
        io, meta = write_value(storage, final, value)
        out[name] = {"io": io.name, "folder": final, "meta": meta}
    storage.write_json(index, out)
    return out


def _load(storage: Storage, output: dict) -> Any:
    io = io_named(output["io"])
    value = io.read(storage, output["folder"], output["meta"])
    return io.travelling(value, storage, output["folder"], output["meta"])


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
    from michelangelo.uniflow.core._task import Task

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


def _import_attribute(path: str, *, import_modules: bool) -> Any:
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        return None
    module = builtins if module_name == "builtins" else sys.modules.get(module_name)
    if module is None and import_modules:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return target


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
