"""A registered revision loaded for serving: weights, signature, and proof it is the right one.

:meth:`ServedModel.load` is what makes a replica ready: it loads the weights through the
registry (which checks their sha256 against the revision record), then replays the input
example recorded at registration and compares the outputs. Any failure raises
:class:`ReadinessError` with the reason, so the replica never takes traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from michelangelo.lib.serving._errors import BadRequest, ReadinessError
from michelangelo.lib.serving._oip import example_arrays

# Replaying the example on another process or thread count may change the last bits.
EXAMPLE_RTOL = 1e-4
EXAMPLE_ATOL = 1e-5


class ServedModel:
    """A model in eval mode with the names of its input and output tensors."""

    def __init__(self, model: Any, signature: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        self.model = model
        self.signature = signature
        self.info = dict(info)  # project_name, model_name, revision_id, weights_sha256
        self.input_names = [s["name"] for s in signature["inputs"]]
        self.output_names = [s["name"] for s in signature["outputs"]]
        # A tensor example is called as model(x); a dict example as model(**inputs).
        self.keyword_inputs = self.input_names != ["input"]
        self._bf16_inputs = [s["name"] for s in signature["inputs"] if s["datatype"] == "BF16"]
        # Set by load() for a revision registered with processing= (a text model).
        self.processing: dict[str, Any] | None = None
        self.tokenizer: Any = None

    @classmethod
    def load(cls, registry_url: str | None, spec: Any) -> ServedModel:
        """Load ``spec`` from the registry at ``registry_url`` and check it end to end."""
        from michelangelo.lib.model_registry import ModelRegistry

        registry = ModelRegistry(registry_url)
        revision = registry.get(spec)
        try:
            model = registry.load_model(revision.spec)  # sha256-verified by the registry
        except Exception as exc:
            raise ReadinessError(
                f"{_name(revision)}: loading the weights failed: {type(exc).__name__}: {exc}"
            ) from exc
        info = {"project_name": revision.project_name, "model_name": revision.model_name,
                "revision_id": revision.revision_id, "weights_sha256": revision.weights_sha256}
        served = cls(model, _signature_of(revision), info)
        served.check_example(revision.input_example, _name(revision))
        served.processing = getattr(revision, "processing", None)
        if served.processing:
            try:
                served.tokenizer = registry.load_tokenizer(revision.spec)
            except Exception as exc:
                raise ReadinessError(f"{_name(revision)}: loading its tokenizer failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return served

    def check_example(self, example: Mapping[str, Any] | None, what: str) -> None:
        """Replay the registered example; raise :class:`ReadinessError` if outputs differ."""
        if not example or not example.get("inputs"):
            raise ReadinessError(
                f"{what} was registered without an input example, so a replica cannot prove "
                "it reproduces the model. Fix: register it again with input_example=..."
            )
        try:
            outputs = self.forward(example_arrays(example["inputs"]))
        except Exception as exc:
            raise ReadinessError(f"{what}: the model failed on its registered input example: "
                                 f"{type(exc).__name__}: {exc}") from exc
        for name, tensor in (example.get("outputs") or {}).items():
            want = np.asarray(tensor["data"], dtype=np.float64).reshape(tensor["shape"])
            got = outputs.get(name)
            if got is None or got.shape != want.shape:
                raise ReadinessError(
                    f"{what}: output {name!r} has shape {None if got is None else list(got.shape)}"
                    f" on the registered example, but {list(want.shape)} was recorded.")
            if not np.allclose(got.astype(np.float64), want, rtol=EXAMPLE_RTOL, atol=EXAMPLE_ATOL,
                               equal_nan=True):
                diff = float(np.max(np.abs(got.astype(np.float64) - want)))
                raise ReadinessError(
                    f"{what}: output {name!r} differs from the one recorded at registration "
                    f"(max abs difference {diff:.3g}); the weights or the model code changed.")

    def forward(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One forward pass over named arrays with the same number of rows."""
        import torch

        tensors = {n: torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in self.input_names}
        for name in self._bf16_inputs:
            tensors[name] = tensors[name].to(torch.bfloat16)
        with torch.inference_mode():
            if self.keyword_inputs:
                out = self.model(**tensors)
            else:
                out = self.model(tensors[self.input_names[0]])
        return self._name_outputs(out)

    def _name_outputs(self, out: Any) -> dict[str, np.ndarray]:
        if isinstance(out, Mapping):
            values = dict(out)
        elif isinstance(out, Sequence) and not hasattr(out, "shape"):
            values = dict(zip(self.output_names, out, strict=False))
        else:
            values = {self.output_names[0]: out}
        return {name: _numpy(value) for name, value in values.items()}

    def forward_many(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Rows of several requests in ONE forward pass; each gets exactly its rows back."""
        return forward_rows(self.forward, requests)


def forward_rows(forward: Any, requests: Sequence[Mapping[str, np.ndarray]]
                 ) -> list[dict[str, np.ndarray]]:
    """``forward`` once over the rows of all ``requests``; each gets exactly its rows back."""
    if len(requests) == 1:
        return [forward(requests[0])]
    names = list(requests[0])
    counts = [len(r[names[0]]) for r in requests]
    merged = {n: np.concatenate([r[n] for r in requests]) for n in names}
    outputs = forward(merged)
    total = sum(counts)
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != total:
            raise BadRequest(f"the model returned output {name!r} of shape "
                             f"{list(value.shape)} for {total} rows; it must return one "
                             "row per input row to be served in batches.")
    bounds = np.cumsum(counts)[:-1]
    split = {name: np.split(value, bounds) for name, value in outputs.items()}
    return [{name: parts[i] for name, parts in split.items()} for i in range(len(requests))]


def _numpy(value: Any) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _signature_of(revision: Any) -> dict[str, Any]:
    signature = getattr(revision, "signature", None)
    if not signature or not signature.get("inputs") or not signature.get("outputs"):
        raise ReadinessError(
            f"{_name(revision)} has no input/output signature, so requests cannot be checked. "
            "Fix: register it again with input_example=...")
    return signature


def _name(revision: Any) -> str:
    return f"{revision.project_name}/{revision.model_name}:{revision.revision_id}"
