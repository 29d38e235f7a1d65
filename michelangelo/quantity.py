"""Kubernetes resource quantities ("8Gi", "512Mi", "2G", "500m", plain numbers).

One parser for every amount a user writes: a RayTask's CPUs, memory and disk, the node
allocatables the KubeRay fit check reads, and the byte-count settings of
:mod:`michelangelo.settings`.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from michelangelo.errors import InputError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_MILLI = {"m": Decimal("0.001")}
__all__ = ["format_bytes", "parse_bytes", "parse_quantity"]

_PATTERN = re.compile(r"^\s*([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_quantity(value: object, *, field: str) -> Decimal:
    """Parse a Kubernetes quantity into a Decimal.

    Args:
        value: ``"8Gi"``, ``"512Mi"``, ``"2G"``, ``"500m"``, an int or a float.
        field: What is being parsed, quoted in errors as written (``"RayTask.head_memory"``).

    Raises:
        ValueError: If the value is not a non-negative quantity.
    """
    if isinstance(value, bool):
        raise InputError(_message(field, value))
    if isinstance(value, (int, float)):
        if value < 0:
            raise InputError(_message(field, value))
        return Decimal(str(value))
    if not isinstance(value, str):
        raise InputError(_message(field, value))
    match = _PATTERN.match(value)
    if match is None:
        raise InputError(_message(field, value))
    number, suffix = match.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise InputError(_message(field, value)) from exc
    if suffix == "":
        return amount
    for table in (_BINARY, _DECIMAL, _MILLI):
        if suffix in table:
            return amount * table[suffix]
    raise InputError(_message(field, value))


def parse_bytes(value: object, *, field: str) -> int:
    """Parse a memory or disk quantity into whole bytes."""
    return int(parse_quantity(value, field=field))


def format_bytes(num: float) -> str:
    """Render a byte count the way Kubernetes users write it (``16Gi``)."""
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if num >= size and (num / size) == int(num / size):
            return f"{int(num // size)}{suffix}"
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if num >= size:
            return f"{num / size:.1f}{suffix}"
    return f"{int(num)}"


def _message(field: str, value: object) -> str:
    return (
        f"{field}={value!r} is not a valid quantity. Use a non-negative number or a "
        "Kubernetes quantity such as '8Gi', '512Mi', '2G' or '500m'."
    )
