"""The Open Inference Protocol (KServe V2) tensor codec, checked against a signature.

A signature is what the registry records: ``{"inputs": [{"name", "datatype", "shape"}],
"outputs": [...]}`` with OIP datatype names and ``-1`` for the batch dimension. Decoding
turns request JSON into named numpy arrays (or raises :class:`BadRequest` naming the
tensor, the value and the fix); encoding turns model outputs back into OIP tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from michelangelo.lib.serving._errors import BadRequest

# OIP datatype -> numpy dtype. BYTES is left out: no registered model takes strings yet.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    # numpy has no bfloat16: BF16 tensors travel as float32 and are cast back for the model.
    "BF16": np.dtype(np.float32),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items() if name != "BF16"}
# Which JSON number kinds each datatype accepts: no silent float -> int truncation.
_ACCEPTS = {"b": "b", "u": "biu", "i": "biu", "f": "biuf"}


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype name of ``array``'s dtype (BF16 and others are widened to FP32)."""
    return _BY_DTYPE.get(array.dtype, "FP32")


def to_array(name: str, data: Any, datatype: str, shape: list[int] | None) -> np.ndarray:
    """``data`` (flat or nested JSON numbers) as an array of ``datatype`` and ``shape``."""
    dtype = DATATYPES[datatype]
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError):
        raise BadRequest(
            f"input {name!r}: data is a ragged nested list; every row must have the same "
            "length. Fix: send a rectangular list (or a flat list with 'shape')."
        ) from None
    if raw.size and raw.dtype.kind not in _ACCEPTS[dtype.kind]:
        wanted = "true/false" if dtype.kind == "b" else (
            "integers" if dtype.kind in "iu" else "numbers")
        raise BadRequest(
            f"input {name!r}: datatype {datatype} takes {wanted}, but data holds "
            f"{_describe_kind(raw)}. Fix: send {wanted}, or the datatype the model was "
            "registered with."
        )
    array = raw.astype(dtype, copy=False) if raw.size else np.zeros(raw.shape, dtype)
    if dtype.kind in "iu" and raw.size and not np.array_equal(array, raw):
        raise BadRequest(
            f"input {name!r}: values do not fit datatype {datatype} (out of range). "
            "Fix: send values inside the datatype's range."
        )
    if shape is not None:
        if array.size != int(np.prod(shape)):
            raise BadRequest(
                f"input {name!r}: shape {shape} needs {int(np.prod(shape))} values, but data "
                f"has {array.size}. Fix: make 'shape' match the data."
            )
        array = array.reshape(shape)
    return array


def _describe_kind(raw: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats",
            "U": "strings", "O": "mixed or non-numeric values"}.get(raw.dtype.kind, "values")


def check_against(spec: Mapping[str, Any], array: np.ndarray) -> None:
    """Raise :class:`BadRequest` unless ``array`` fits the signature entry ``spec``."""
    name, shape = spec["name"], list(spec.get("shape") or [])
    if shape and array.ndim != len(shape):
        raise BadRequest(
            f"input {name!r}: got shape {list(array.shape)}, but the model takes "
            f"{_show_shape(shape)} (rank {len(shape)}). Fix: send a batch of rows, e.g. "
            f"{_example_rows(shape)}."
        )
    for axis, (want, got) in enumerate(zip(shape, array.shape, strict=False)):
        if want not in (-1, None) and int(want) != got:
            raise BadRequest(
                f"input {name!r}: dimension {axis} is {got}, but the model takes "
                f"{_show_shape(shape)}. Fix: send rows of shape {_show_shape(shape[1:])}."
            )


def _show_shape(shape: list[int]) -> str:
    return "[" + ", ".join("N" if d in (-1, None) else str(d) for d in shape) + "]"


def _example_rows(shape: list[int]) -> str:
    width = shape[1] if len(shape) == 2 and shape[1] not in (-1, None) else 1
    return "[[" + ", ".join(["0.0"] * min(width, 3)) + (", ..." if width > 3 else "") + "]]"


def decode_infer(body: Any, signature: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """An OIP ``infer`` request body as named arrays, plus the output names asked for."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with an 'inputs' list, e.g. "
                         '{"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", '
                         '"data": [...]}]}.')
    tensors = body.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise BadRequest(f"'inputs' must be a non-empty list of tensors, got {_short(tensors)}. "
                         "Fix: send [{'name', 'shape', 'datatype', 'data'}, ...].")
    specs = {s["name"]: s for s in signature["inputs"]}
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise BadRequest(f"inputs[{index}] must be an object with name, shape, datatype "
                             f"and data, got {_short(tensor)}.")
        missing = [k for k in ("name", "shape", "datatype", "data") if k not in tensor]
        if missing:
            raise BadRequest(f"inputs[{index}] lacks {missing}. Fix: every tensor needs "
                             "'name', 'shape', 'datatype' and 'data'.")
        name = tensor["name"]
        if name not in specs:
            raise BadRequest(f"unknown input tensor {name!r}; the model takes "
                             f"{sorted(specs)}. Fix: use those names.")
        if name in arrays:
            raise BadRequest(f"input tensor {name!r} is given twice. Fix: send it once.")
        shape = tensor["shape"]
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                           for d in shape)):
            raise BadRequest(f"input {name!r}: shape must be a list of non-negative integers, "
                             f"got {_short(shape)}.")
        datatype, expected = tensor["datatype"], specs[name]["datatype"]
        if datatype != expected:
            raise BadRequest(f"input {name!r}: datatype {datatype!r} does not match the "
                             f"registered {expected!r}. Fix: send datatype {expected!r}.")
        array = to_array(name, tensor["data"], datatype, shape)
        check_against(specs[name], array)
        arrays[name] = array
    _check_complete(arrays, specs)
    wanted = body.get("outputs")
    names = None
    if wanted is not None:
        if not isinstance(wanted, list) or not all(isinstance(o, dict) and "name" in o
                                                    for o in wanted):
            raise BadRequest("'outputs' must be a list of {'name': ...} objects.")
        known = [o["name"] for o in signature["outputs"]]
        names = [o["name"] for o in wanted]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise BadRequest(f"unknown output tensor(s) {unknown}; the model returns {known}.")
    return arrays, names


def decode_simple(body: Any, signature: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The simple form: ``{"inputs": rows}`` or ``{"inputs": {name: rows, ...}}``."""
    specs = {s["name"]: s for s in signature["inputs"]}
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadRequest('the body must be a JSON object {"inputs": [[...], ...]} holding a '
                         "batch of rows. Fix: wrap your rows in {\"inputs\": ...}.")
    given = body["inputs"]
    if not isinstance(given, dict):
        if len(specs) != 1:
            raise BadRequest(f"this model takes several inputs {sorted(specs)}; send "
                             '{"inputs": {name: rows, ...}}.')
        given = {next(iter(specs)): given}
    arrays = {}
    for name, rows in given.items():
        if name not in specs:
            raise BadRequest(f"unknown input tensor {name!r}; the model takes "
                             f"{sorted(specs)}. Fix: use those names.")
        array = to_array(name, rows, specs[name]["datatype"], None)
        check_against(specs[name], array)
        arrays[name] = array
    _check_complete(arrays, specs)
    return arrays


def _check_complete(arrays: dict[str, np.ndarray], specs: Mapping[str, Any]) -> None:
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise BadRequest(f"missing input tensor(s) {missing}; the model takes {sorted(specs)}.")
    rows = {name: (a.shape[0] if a.ndim else None) for name, a in arrays.items()}
    if None in rows.values():
        raise BadRequest(f"inputs must have a batch dimension first, got shapes "
                         f"{ {n: list(a.shape) for n, a in arrays.items()} }.")
    if len(set(rows.values())) > 1:
        raise BadRequest(f"all inputs must have the same number of rows, got {rows}.")
    if next(iter(rows.values())) == 0:
        raise BadRequest("the batch is empty. Fix: send at least one row.")


def encode_outputs(outputs: Mapping[str, np.ndarray], names: list[str] | None = None) -> list[dict]:
    """Named arrays as OIP output tensors (flat data, shape, datatype)."""
    chosen = names if names is not None else list(outputs)
    return [{"name": n, "datatype": datatype_of(outputs[n]), "shape": list(outputs[n].shape),
             "data": outputs[n].reshape(-1).tolist()} for n in chosen]


def example_arrays(tensors: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """A registry input example's ``{name: {datatype, shape, data}}`` as arrays."""
    return {name: to_array(name, t["data"], t["datatype"], list(t["shape"]))
            for name, t in tensors.items()}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
