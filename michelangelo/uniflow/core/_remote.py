"""One task attempt run by another process, possibly on another machine: the driver's side.

A plugin that runs task bodies elsewhere (the Ray plugin's Jobs API dispatch, say) gets a
:class:`RemoteCall`: a JSON description of the call saved in the call's folder. The remote side
calls :func:`execute_remote_call` (in ``_remote_attempt``), which loads the task function from
its source file, reads the inputs the driver stored, runs the body under the same time limit,
persists the result with the same IO registry and writes a small result file; the driver then
reads that file back with :func:`read_remote_result`. Retries, caching and resume stay on the
driver, as for local calls.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import json
import os
import posixpath
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from michelangelo.uniflow.core._io import write_value
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.errors import RemoteTaskError, UserError

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
def prepare_remote_call(storage: Storage, task: Any, run_id: str, call_id: str,
                        attempt: int, call_dir: str, arguments: dict[str, Any]) -> RemoteCall:
    """Store the call's inputs (once per call) and its description; return the description.

    ``task`` is a :class:`~michelangelo.uniflow.core.Task` (this module sits below it).
    """
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
