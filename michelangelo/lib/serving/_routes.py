"""HTTP paths of one endpoint, as plain async functions (no Ray in here).

Paths are relative to the deployment's route prefix ``/{name}``:

- ``POST /`` the simple form: ``{"inputs": rows}`` -> ``{"predictions", "model"}``
- Open Inference Protocol REST: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
  ``GET /v2/models/{name}[/versions/{rev}]``, ``.../ready``, ``POST .../infer`` (JSON, or
  binary tensors after a JSON header: see ``_binary``).

The root ``/v2`` gateway (``_gateway``) hands model paths to the same code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from michelangelo.lib.serving._binary import HEADER_LENGTH, parse_json, split_body
from michelangelo.lib.serving._errors import MethodNotAllowed, NotFound, NotReady
from michelangelo.lib.serving._oip import (
    binary_outputs,
    decode_infer,
    decode_simple,
    encode_infer_outputs,
    json_rows,
)

Predict = Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]
SERVER_NAME = "michelangelo"
PROTOCOL_VERSION = "2"
EXTENSIONS = ["binary_tensor_data"]


class Answer(NamedTuple):
    """One answer: status, JSON body, and the binary outputs that follow it (if any)."""

    status: int
    body: Any
    tail: bytes = b""


def server_metadata(extensions: list[str] | None = None) -> dict[str, Any]:
    """``GET /v2``: who answers and which protocol extensions it speaks."""
    return {"name": SERVER_NAME, "version": PROTOCOL_VERSION,
            "extensions": list(extensions if extensions is not None else EXTENSIONS)}


class Routes:
    """Answers one endpoint's requests for the model described by ``info`` and ``signature``.

    Args:
        name: The deployment name, which is also the OIP model name.
        info: ``project_name``, ``model_name``, ``revision_id``, ``weights_sha256``.
        signature: The registered input and output tensors.
        predict: Runs the model on named arrays (batched or not; the caller decides).
        is_ready: Whether the model may answer now.
    """

    def __init__(self, name: str, info: Mapping[str, Any], signature: Mapping[str, Any],
                 predict: Predict, is_ready: Callable[[], bool] = lambda: True) -> None:
        self.name = name
        self.info = dict(info)
        self.signature = signature
        self.predict = predict
        self.is_ready = is_ready
        self.version = str(info["revision_id"])

    async def handle(self, method: str, path: str, read_body: Callable[[], Awaitable[bytes]],
                     headers: Mapping[str, str] | None = None) -> Answer:
        """The :class:`Answer` to one request; raises only :class:`HTTPError`.

        ``headers`` are the request's (lowercase names); ``Inference-Header-Content-Length``
        marks a body with binary tensors after its JSON.
        """
        parts = [p for p in path.split("/") if p]
        if not parts:
            _allow(method, "POST")
            return Answer(200, await self._simple(parse_json(await read_body())))
        if parts[0] != "v2":
            raise NotFound(f"no path {path!r} here. POST to this deployment's URL, or use the "
                           f"Open Inference Protocol paths under /v2 (model {self.name!r}).")
        rest = parts[1:]
        if not rest:
            _allow(method, "GET")
            return Answer(200, server_metadata())
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            _allow(method, "GET")
            if rest[1] == "ready":
                self._require_ready()
                return Answer(200, {"ready": True})
            return Answer(200, {"live": True})
        if rest[0] == "models" and len(rest) >= 2:
            return await self._model_path(method, rest[1], rest[2:], read_body, headers or {})
        raise NotFound(f"no Open Inference Protocol path {path!r}; see GET /v2/models/{self.name}.")

    async def _model_path(self, method: str, model: str, tail: list[str],
                          read_body: Callable[[], Awaitable[bytes]],
                          headers: Mapping[str, str]) -> Answer:
        if model != self.name:
            raise NotFound(f"model {model!r} is not served here; this deployment serves "
                           f"{self.name!r}.")
        if tail[:1] == ["versions"]:
            if len(tail) < 2:
                raise NotFound("a version path needs a revision: /versions/{revision}.")
            if tail[1] != self.version:
                raise NotFound(f"model {self.name!r} serves revision {self.version}, not "
                               f"{tail[1]!r}. Fix: use /versions/{self.version}, or deploy that "
                               "revision under its own name.")
            tail = tail[2:]
        if not tail:
            _allow(method, "GET")
            return Answer(200, self.metadata())
        if tail == ["ready"]:
            _allow(method, "GET")
            self._require_ready()
            return Answer(200, {"name": self.name, "ready": True})
        if tail == ["infer"]:
            _allow(method, "POST")
            body, binary = split_body(await read_body(), headers.get(HEADER_LENGTH))
            return await self._infer(body, binary)
        raise NotFound(f"no path {'/'.join(tail)!r} under model {self.name!r}; use "
                       "'', 'ready' or 'infer'.")

    def metadata(self) -> dict[str, Any]:
        """OIP model metadata: the tensors recorded at registration."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "pytorch",
            "inputs": [_tensor_meta(t) for t in self.signature["inputs"]],
            "outputs": [_tensor_meta(t) for t in self.signature["outputs"]],
            "parameters": dict(self.info),
        }

    async def _infer(self, body: Any, binary: bytes = b"") -> Answer:
        arrays, names = decode_infer(body, self.signature, binary)
        self._require_ready()
        outputs = await self.predict(arrays)
        chosen = names if names is not None else list(outputs)
        tensors, tail = encode_infer_outputs(outputs, chosen, binary_outputs(body, chosen))
        answer = {"model_name": self.name, "model_version": self.version, "outputs": tensors}
        if isinstance(body.get("id"), str):
            answer["id"] = body["id"]
        return Answer(200, answer, tail)

    async def _simple(self, body: Any) -> dict[str, Any]:
        arrays = decode_simple(body, self.signature)
        self._require_ready()
        outputs = await self.predict(arrays)
        if len(outputs) == 1:
            predictions: Any = json_rows(*next(iter(outputs.items())))
        else:
            predictions = {n: json_rows(n, v) for n, v in outputs.items()}
        return {"predictions": predictions, "model": self.info}

    def _require_ready(self) -> None:
        if not self.is_ready():
            raise NotReady(f"model {self.name!r} is not ready (loading or shutting down); "
                           "retry shortly.")


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise MethodNotAllowed(f"this path takes {allowed}, not {method}.")


def _tensor_meta(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": spec["name"], "datatype": spec["datatype"], "shape": list(spec["shape"])}
