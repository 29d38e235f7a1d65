"""Model factories stored by reference (module + qualified name), never pickled.

A factory defined in a script run as ``__main__`` is recorded with the script's path as
well, so a later process (a serving replica, a CLI call) can import the script again as an
ordinary module and find the function in it. Lambdas, closures and methods of local classes
have no importable name and are refused when registering.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from michelangelo.errors import InputError

__all__ = ["factory_reference", "resolve_factory"]


def _fix(fn: Any) -> str:
    return (f"Fix: define the factory with 'def' at the top level of a module (or of the script "
            f"you run), e.g. 'def create_model(**kwargs): ...', and pass that function; "
            f"put arguments in create_model_fn_kwargs instead of capturing them "
            f"(got {fn!r}).")


def _check_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(kwargs, Mapping):
        raise InputError(f"create_model_fn_kwargs must be a dict, got {kwargs!r}.")
    try:
        encoded = json.dumps(dict(kwargs), sort_keys=True)
    except (TypeError, ValueError) as error:
        raise InputError(
            f"create_model_fn_kwargs={dict(kwargs)!r} is not JSON-serialisable ({error}); the "
            "registry stores factory arguments as JSON, never pickled. Fix: pass plain numbers, "
            "strings, lists and dicts, and build anything richer inside the factory."
        ) from None
    return json.loads(encoded)


def factory_reference(fn: Callable[..., Any], kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Describe ``fn`` so that :func:`resolve_factory` can import it again elsewhere.

    Args:
        fn: A top-level function or class (``create_model_fn``).
        kwargs: Its keyword arguments, JSON-serialisable.

    Returns:
        ``{"module", "qualname", "script_path", "kwargs"}``; ``script_path`` is set only for
        factories defined in the ``__main__`` script or in a file loaded under a name that
        another process could not import.

    Raises:
        ValueError: ``fn`` is a lambda, a closure, a nested function, not importable by
            name, or ``kwargs`` is not JSON.
    """
    if not callable(fn):
        raise InputError(f"create_model_fn={fn!r} is not callable. Fix: pass the function "
                         "(or class) that builds the model.")
    kwargs = _check_kwargs(kwargs or {})
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module_name or not qualname:
        raise InputError(f"create_model_fn has no module or qualified name. {_fix(fn)}")
    if getattr(fn, "__name__", "") == "<lambda>":
        raise InputError(f"create_model_fn is a lambda, which cannot be imported by name. "
                         f"{_fix(fn)}")
    if "<locals>" in qualname or getattr(fn, "__closure__", None):
        raise InputError(f"create_model_fn {qualname!r} is a closure or nested function, which "
                         f"cannot be imported by name. {_fix(fn)}")
    script_path = None
    if module_name == "__main__":
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        if not path:
            raise InputError(
                "create_model_fn is defined in an interactive session (__main__ has no file), "
                f"so nothing could import it again. {_fix(fn)}")
        script_path = os.path.abspath(path)
    else:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        script_path = None
        if _lookup(module, qualname) is not fn:
            raise InputError(f"create_model_fn {module_name}.{qualname} does not resolve back to "
                             f"the same object by name. {_fix(fn)}")
        path = getattr(module, "__file__", None)
        if path and _importable_by_name(module_name) is False:
            # A file loaded under a made-up name (`michelangelo run FILE:WF` does this): only
            # its path can bring it back in another process.
            script_path = os.path.abspath(path)
    reference = {"module": module_name, "qualname": qualname, "script_path": script_path,
                 "kwargs": kwargs}
    if script_path:
        # Also where the script lies in the folder this process runs from (a remote job's
        # working_dir is the project): a process started in another copy of the project (a
        # RayService replica, a colleague's checkout) finds it there.
        relative = os.path.relpath(script_path, os.getcwd())
        if not relative.startswith(os.pardir + os.sep) and not os.path.isabs(relative):
            reference["script_relpath"] = relative.replace(os.sep, "/")
    return reference


def _importable_by_name(module_name: str) -> bool | None:
    """Whether a fresh process finds ``module_name`` on its path (None: cannot tell)."""
    import importlib.machinery

    top = module_name.split(".")[0]
    if top in sys.builtin_module_names:
        return True
    try:
        return importlib.machinery.PathFinder.find_spec(top) is not None
    except (ImportError, ValueError):
        return None


def _lookup(module: Any, qualname: str) -> Any:
    target = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _import_script(path: str) -> Any:
    # A stable module name per script path: importing twice reuses the first import, and the
    # name never collides with the importing process's own __main__.
    name = "_ma_factory_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    if not os.path.isfile(path):
        raise InputError(f"the factory's script {path!r} no longer exists. Fix: restore it, or "
                         "pass create_model_fn to load_model() to build the model yourself.")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = os.path.dirname(path)
    added = directory not in sys.path
    if added:  # the script's own sibling imports must resolve as when it ran
        sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if added:
            sys.path.remove(directory)
    return module


def _script_here(reference: Mapping[str, Any]) -> str:
    """The recorded script path, else the same project path under this process's folder."""
    path = reference["script_path"]
    relative = reference.get("script_relpath")
    if not os.path.isfile(path) and relative:
        candidate = os.path.abspath(relative)
        if os.path.isfile(candidate):
            return candidate
    return path


def resolve_factory(reference: Mapping[str, Any]) -> Callable[..., Any]:
    """Import the factory described by :func:`factory_reference`.

    Raises:
        ValueError: The module, script or name cannot be found.
    """
    if not reference or not reference.get("qualname"):
        raise InputError("this revision has no recorded factory. Fix: pass create_model_fn to "
                         "load_model(), or register with create_model_fn=...")
    qualname = reference["qualname"]
    if reference.get("script_path"):
        where = _script_here(reference)
        module = _import_script(where)
    else:
        where = reference["module"]
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise InputError(f"cannot import the factory's module {where!r} ({error}). Fix: "
                             "install or put it on PYTHONPATH.") from None
    fn = _lookup(module, qualname)
    if fn is None or not callable(fn):
        raise InputError(f"{where!r} has no callable {qualname!r} any more. Fix: restore it, or "
                         "pass create_model_fn to load_model().")
    return fn


def describe(fn: Any) -> str:
    """A short printable name for logs."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def source_file(fn: Any) -> str | None:
    """The file defining ``fn``, if known (kept in lineage to find the code again)."""
    try:
        return inspect.getsourcefile(fn)
    except TypeError:
        return None
