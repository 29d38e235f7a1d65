"""Input examples and the Open Inference Protocol signature derived from them.

A tensor (or array) example is one input named ``input`` and the model is called as
``model(x)``; a dict example names one input per key and the model is called as
``model(**inputs)``. The outputs the model gives for the example at registration are kept
next to it, so a serving replica can replay the example and compare before taking traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from michelangelo.errors import InputError

__all__ = ["example_and_signature", "to_tensors"]

_DATATYPES = {
    torch.float32: "FP32", torch.float64: "FP64", torch.float16: "FP16", torch.bfloat16: "BF16",
    torch.int8: "INT8", torch.int16: "INT16", torch.int32: "INT32", torch.int64: "INT64",
    torch.uint8: "UINT8", torch.bool: "BOOL",
}
_DTYPES = {name: dtype for dtype, name in _DATATYPES.items()}


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(value.copy())
    except ImportError:  # pragma: no cover - numpy is a base dependency
        pass
    raise InputError(f"input_example[{name!r}] is a {type(value).__name__}; expected a "
                     "torch.Tensor or numpy array. Fix: pass a small batch, e.g. "
                     "torch.randn(2, n_features).")


def _entry(tensor: torch.Tensor, name: str, where: str) -> dict[str, Any]:
    if tensor.dtype not in _DATATYPES:
        raise InputError(f"{where}[{name!r}] has dtype {tensor.dtype}, which has no Open "
                         f"Inference Protocol datatype. Fix: use one of "
                         f"{sorted(str(d) for d in _DATATYPES)}.")
    if tensor.dim() == 0:
        raise InputError(f"{where}[{name!r}] is a scalar; examples need a batch dimension. "
                         "Fix: pass at least shape [1, ...].")
    return {"datatype": _DATATYPES[tensor.dtype], "shape": list(tensor.shape),
            "data": tensor.float().tolist() if tensor.dtype == torch.bfloat16
            else tensor.tolist()}


def _outputs_of(result: Any) -> dict[str, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return {"output": result}
    if isinstance(result, Mapping):
        return {str(k): v for k, v in result.items() if isinstance(v, torch.Tensor)}
    if isinstance(result, tuple | list):
        return {f"output_{i}": v for i, v in enumerate(result) if isinstance(v, torch.Tensor)}
    raise InputError(f"the model returned a {type(result).__name__} for the input example; "
                     "expected a tensor, a tuple of tensors or a dict of tensors.")


def to_tensors(inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Rebuild tensors from the stored ``{"datatype", "shape", "data"}`` entries."""
    return {name: torch.tensor(entry["data"], dtype=_DTYPES[entry["datatype"]]).reshape(
        entry["shape"]) for name, entry in inputs.items()}


def _spec_list(entries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "datatype": e["datatype"], "shape": [-1, *e["shape"][1:]]}
            for name, e in entries.items()]


def example_and_signature(model: torch.nn.Module, example: Any, *,
                          allow_non_finite: bool | Sequence[str] = False,
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``model`` on ``example`` in eval mode; return ``(input_example, signature)``.

    ``allow_non_finite`` (input names, or ``True`` for all) marks the inputs whose NaN and
    infinities the model handles, as ``"allow_non_finite": true`` in their signature entry.

    Raises:
        ValueError: The example has an unsupported type, or the model fails on it (the model
            error is chained).
    """
    named = ({str(k): _as_tensor(str(k), v) for k, v in example.items()}
             if isinstance(example, Mapping) else {"input": _as_tensor("input", example)})
    if not named:
        raise InputError("input_example is an empty dict. Fix: pass at least one input.")
    inputs = {name: _entry(t, name, "input_example") for name, t in named.items()}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            result = (model(**named) if isinstance(example, Mapping)
                      else model(named["input"]))
    except Exception as error:
        raise InputError(
            f"the model failed on input_example ({type(error).__name__}: {error}). Fix: pass an "
            "example the model accepts: a tensor is called as model(x), a dict as "
            "model(**inputs)."
        ) from error
    finally:
        model.train(was_training)
    outputs = {name: _entry(t.detach().cpu(), name, "model output")
               for name, t in _outputs_of(result).items()}
    specs = _spec_list(inputs)
    for spec in specs:
        if spec["name"] in _allowed(allow_non_finite, list(inputs)):
            spec["allow_non_finite"] = True
    return ({"inputs": inputs, "outputs": outputs},
            {"inputs": specs, "outputs": _spec_list(outputs)})


def _allowed(allow: bool | Sequence[str], names: list[str]) -> set[str]:
    if isinstance(allow, bool):
        return set(names) if allow else set()
    if isinstance(allow, str) or not all(isinstance(n, str) for n in allow):
        raise InputError(f"allow_non_finite={allow!r} must be True, False or a list of input "
                         f"names. Fix: e.g. allow_non_finite={names[:1]!r}.")
    unknown = sorted(set(allow) - set(names))
    if unknown:
        raise InputError(f"allow_non_finite names {unknown}, but the model's inputs are "
                         f"{names}. Fix: use those names.")
    return set(allow)
