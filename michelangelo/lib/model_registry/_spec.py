"""Model specs: ``ModelSpec`` objects and their string form ``project/model[:rev|@alias]``."""

from __future__ import annotations

import re

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import ModelSpec

__all__ = ["check_alias", "check_name", "parse_model_spec"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")


def check_name(field: str, value: object) -> str:
    """Return ``value`` if it is a valid project or model name, else raise naming ``field``.

    Names become folder names in storage, so they are kept to letters, digits, ``.``, ``_``
    and ``-`` (no ``/``, ``:`` or ``@``, which the string form of a spec uses).
    """
    if not isinstance(value, str) or not _NAME.match(value) or value in {".", ".."}:
        raise InputError(
            f"{field}={value!r} is not a valid name. Fix: use 1-128 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (no '/', ':' or '@')."
        )
    return value


def check_alias(value: object) -> str:
    """Return ``value`` (without a leading ``@``) if it is a valid alias name."""
    if isinstance(value, str) and value.startswith("@"):
        value = value[1:]
    if not isinstance(value, str) or not _ALIAS.match(value) or value.lower() == "latest":
        raise InputError(
            f"alias={value!r} is not a valid alias. Fix: use a letter followed by up to 63 "
            "letters, digits, '.', '_' or '-' (e.g. 'champion'); 'latest' is reserved."
        )
    return value


def _revision_of(text: str, value: object) -> int | str | None:
    if value is None or isinstance(value, bool):
        if isinstance(value, bool):
            raise InputError(f"revision_id={value!r} in {text!r} is not a revision number. "
                             "Fix: pass an int >= 1, '@alias' or None.")
        return None
    if isinstance(value, int):
        if value < 1:
            raise InputError(f"revision_id={value!r} in {text!r} must be >= 1 (revisions are "
                             "numbered 1, 2, 3 ...). Fix: pass an existing revision number.")
        return value
    if isinstance(value, str):
        raw = value.strip()
        if raw.isdigit():
            return _revision_of(text, int(raw))
        if raw.lower() == "latest":
            return None
        return "@" + check_alias(raw)
    raise InputError(f"revision_id={value!r} in {text!r} must be an int, '@alias' or None.")


def parse_model_spec(spec: str | ModelSpec) -> ModelSpec:
    """Normalise a spec to a ``ModelSpec`` whose ``revision_id`` is an int, ``"@alias"`` or None.

    Accepted forms: ``ModelSpec(...)`` (a ``revision_id`` of ``3``, ``"3"``, ``"@champion"``,
    ``"champion"`` or ``None``), and the strings ``"project/model"`` (latest),
    ``"project/model:3"`` and ``"project/model@champion"``.

    Args:
        spec: The spec to normalise.

    Returns:
        A ``ModelSpec`` with validated names.

    Raises:
        ValueError: The spec is malformed; the message shows the accepted forms.
    """
    if isinstance(spec, ModelSpec):
        check_name("project_name", spec.project_name)
        check_name("model_name", spec.model_name)
        text = f"{spec.project_name}/{spec.model_name}"
        return ModelSpec(spec.project_name, spec.model_name, _revision_of(text, spec.revision_id))
    if not isinstance(spec, str):
        raise InputError(f"model spec {spec!r} must be a ModelSpec or a string like "
                         "'project/model', 'project/model:3' or 'project/model@champion'.")
    text = spec.strip()
    match = re.fullmatch(r"([^/:@]+)/([^/:@]+)(?::([^/:@]+)|@([^/:@]+))?", text)
    if match is None:
        raise InputError(f"model spec {spec!r} is malformed. Fix: write 'project/model' (latest), "
                         "'project/model:3' (revision 3) or 'project/model@champion' (an alias).")
    project, model, number, alias = match.groups()
    check_name("project_name", project)
    check_name("model_name", model)
    if number is not None and not number.isdigit():
        raise InputError(f"model spec {spec!r}: revision {number!r} after ':' is not a number. "
                         f"Fix: use '{project}/{model}:3', or '@{number}' for an alias.")
    revision = _revision_of(text, int(number) if number is not None else
                            ("@" + alias if alias is not None else None))
    return ModelSpec(project, model, revision)
