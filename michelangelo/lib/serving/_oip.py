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

from michelangelo.lib.serving._binary import BinaryReader, from_bytes, to_bytes
from michelangelo.lib.serving._errors import BadRequest

# OIP datatype -> numpy dtype. BYTES tensors are object arrays holding ``bytes`` (UTF-8 text
# in JSON, length-prefixed in binary).
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
    "BYTES": np.dtype(object),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items() if name != "BF16"}
# Which JSON number kinds each datatype accepts: no silent float -> int truncation.
_ACCEPTS = {"b": "b", "u": "biu", "i": "biu", "f": "biuf"}


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype name of ``array``'s dtype (BF16 and others are widened to FP32).

    Strings, bytes and object arrays are ``BYTES``.
    """
    if array.dtype.kind in "OSU":
        return "BYTES"
    return _BY_DTYPE.get(array.dtype, "FP32")


def as_bytes_array(name: str, array: np.ndarray) -> np.ndarray:
    """``array`` (strings, bytes or objects holding them) as an object array of ``bytes``."""
    out = np.empty(array.shape, dtype=object)
    flat, target = array.reshape(-1), out.reshape(-1)
    for i, value in enumerate(flat):
        if isinstance(value, np.bytes_ | bytes):
            target[i] = bytes(value)
        elif isinstance(value, np.str_ | str):
            target[i] = str(value).encode("utf-8")
        else:
            raise BadRequest(
                f"input {name!r}: datatype BYTES takes strings, but element {i} is "
                f"{_short(value.item() if isinstance(value, np.generic) else value)}. Fix: send "
                'each element as a JSON string, e.g. "data": ["hello"].')
    return out


def to_array(name: str, data: Any, datatype: str, shape: list[int] | None) -> np.ndarray:
    """``data`` (flat or nested JSON numbers) as an array of ``datatype`` and ``shape``."""
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        return _to_bytes_array(name, data, shape)
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
    with np.errstate(over="ignore"):  # too large for the datatype: refused as non-finite below
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


def _to_bytes_array(name: str, data: Any, shape: list[int] | None) -> np.ndarray:
    if isinstance(data, str):
        data = [data]
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: datatype BYTES takes a list of strings, got "
                         f"{_short(data)}. Fix: send e.g. [\"hello\", \"world\"].")
    try:
        raw = np.array(data, dtype=object)
    except (ValueError, TypeError):
        raw = None
    if raw is None or any(isinstance(v, list) for v in raw.reshape(-1)):
        raise BadRequest(
            f"input {name!r}: data is a ragged nested list; every row must have the same "
            "length. Fix: send a rectangular list (or a flat list with 'shape').")
    array = as_bytes_array(name, raw)
    if shape is not None:
        if array.size != int(np.prod(shape)):
            raise BadRequest(
                f"input {name!r}: shape {shape} needs {int(np.prod(shape))} values, but data "
                f"has {array.size}. Fix: make 'shape' match the data.")
        array = array.reshape(shape)
    return array


def _describe_kind(raw: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats",
            "U": "strings", "O": "mixed or non-numeric values"}.get(raw.dtype.kind, "values")


def check_against(spec: Mapping[str, Any], array: np.ndarray) -> None:
    """Raise :class:`BadRequest` unless ``array`` fits the signature entry ``spec``.

    Besides rank and fixed dimensions, float values must be finite (no NaN, no infinity,
    nothing beyond the datatype's range) unless the signature entry says
    ``"allow_non_finite": true`` (``register(..., allow_non_finite=...)``).
    """
    name, shape = spec["name"], list(spec.get("shape") or [])
    if not spec.get("allow_non_finite"):
        _check_finite(f"input {name!r}", array, "Fix: send finite numbers within "
                      f"{spec['datatype']}'s range, or register the model with "
                      f"allow_non_finite=[{name!r}] if it handles them.")
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


def _check_finite(what: str, array: np.ndarray, fix: str) -> None:
    if array.dtype.kind != "f" or not array.size:
        return
    finite = np.isfinite(array)
    if finite.all():
        return
    flat = int(np.argmin(finite.reshape(-1)))
    where = [int(i) for i in np.unravel_index(flat, array.shape)]
    value = array.reshape(-1)[flat]
    count = int(finite.size - np.count_nonzero(finite))
    raise BadRequest(f"{what} holds {count} non-finite value(s); the first is "
                     f"{_show_value(value)} at position {where}. {fix}")


def _show_value(value: Any) -> str:
    if np.isnan(value):
        return "NaN"
    return "Infinity (or a number too large for the datatype)" if value > 0 else (
        "-Infinity (or a number too large for the datatype)")


def _show_shape(shape: list[int]) -> str:
    return "[" + ", ".join("N" if d in (-1, None) else str(d) for d in shape) + "]"


def _example_rows(shape: list[int]) -> str:
    width = shape[1] if len(shape) == 2 and shape[1] not in (-1, None) else 1
    return "[[" + ", ".join(["0.0"] * min(width, 3)) + (", ..." if width > 3 else "") + "]]"


def decode_infer(body: Any, signature: Mapping[str, Any], binary: bytes = b""
                 ) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """An OIP ``infer`` request body as named arrays, plus the output names asked for.

    ``binary`` is what followed the JSON header (the binary tensor extension): each input
    with ``parameters.binary_data_size`` takes its bytes from it, in order.
    """
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
    reader = BinaryReader(binary)
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise BadRequest(f"inputs[{index}] must be an object with name, shape, datatype "
                             f"and data, got {_short(tensor)}.")
        size = _parameters(tensor, f"inputs[{index}]").get("binary_data_size")
        needed = ("name", "shape", "datatype") if size is not None else (
            "name", "shape", "datatype", "data")
        missing = [k for k in needed if k not in tensor]
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
        if size is not None:
            array = from_bytes(name, reader.take(name, size), datatype, shape)
        else:
            array = to_array(name, tensor["data"], datatype, shape)
        check_against(specs[name], array)
        arrays[name] = array
    reader.finish()
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


def binary_outputs(body: Mapping[str, Any], names: list[str]) -> set[str]:
    """Which of ``names`` the request asks back as binary data.

    An output's own ``parameters.binary_data`` decides; otherwise the request's
    ``parameters.binary_data_output`` (what ``tritonclient`` sends when it names no outputs).
    """
    default = _parameters(body, "the request").get("binary_data_output", False)
    asked = {o["name"]: _parameters(o, f"output {o['name']!r}").get("binary_data", default)
             for o in body.get("outputs") or []}
    chosen = {n for n in names if asked.get(n, default)}
    for name in names:
        flag = asked.get(name, default)
        if not isinstance(flag, bool):
            raise BadRequest(f"output {name!r}: binary_data must be true or false, got "
                             f"{flag!r}.")
    return chosen


def _parameters(obj: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequest(f"{what}: 'parameters' must be a JSON object, got {_short(params)}.")
    return params


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
    """Named arrays as OIP output tensors in JSON (flat data, shape, datatype)."""
    return encode_infer_outputs(outputs, names)[0]


def encode_infer_outputs(outputs: Mapping[str, np.ndarray], names: list[str] | None = None,
                         binary: set[str] | frozenset[str] = frozenset()) -> tuple[list[dict], bytes]:
    """OIP output tensors, plus the bytes of those in ``binary`` (which carry no ``data``).

    JSON cannot carry NaN or infinities, so an output holding them must be asked for in
    binary; in JSON it is refused with its name and position.
    """
    chosen = names if names is not None else list(outputs)
    tensors, tail = [], []
    for name in chosen:
        array = np.asarray(outputs[name])
        datatype = datatype_of(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in binary:
            raw = to_bytes(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        elif datatype == "BYTES":
            entry["data"] = _texts(name, array).reshape(-1).tolist()
        else:
            _check_finite(f"the model's output {name!r}", array,
                          "JSON cannot carry it. Fix: ask for this output as binary data "
                          "(parameters.binary_data_output), or check the model on this input.")
            entry["data"] = array.reshape(-1).tolist()
        tensors.append(entry)
    return tensors, b"".join(tail)


def _texts(name: str, array: np.ndarray) -> np.ndarray:
    """A BYTES output as an object array of ``str`` (JSON carries text, not raw bytes)."""
    out = np.empty(array.shape, dtype=object)
    target = out.reshape(-1)
    for i, value in enumerate(array.reshape(-1)):
        if isinstance(value, bytes | np.bytes_):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(
                    f"the model's output {name!r} element {i} is not UTF-8 text, which JSON "
                    "cannot carry. Fix: ask for this output as binary data "
                    "(parameters.binary_data_output).") from None
        target[i] = str(value)
    return out


def json_rows(name: str, array: np.ndarray) -> Any:
    """An output as nested lists for the simple form (refused if JSON cannot carry it)."""
    if datatype_of(array) == "BYTES":
        return _texts(name, array).tolist()
    _check_finite(f"the model's output {name!r}", array,
                  "JSON cannot carry it. Fix: use the Open Inference Protocol's infer path with "
                  "binary output, or check the model on this input.")
    return array.tolist()


def example_arrays(tensors: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """A registry input example's ``{name: {datatype, shape, data}}`` as arrays."""
    return {name: to_array(name, t["data"], t["datatype"], list(t["shape"]))
            for name, t in tensors.items()}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
