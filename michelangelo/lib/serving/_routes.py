"""HTTP paths of one endpoint, as plain async functions (no Ray in here).

Paths are relative to the deployment's route prefix ``/{name}``:

- ``POST /`` the simple form: ``{"inputs": rows}`` -> ``{"predictions", "model"}``
- Open Inference Protocol REST: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
  ``GET /v2/models/{name}[/versions/{rev}]``, ``.../ready``, ``POST .../infer`` (JSON, or
  binary tensors after a JSON header: see ``_binary``).
- The generate extension, for text models (``_text``): ``POST .../generate``
  (``{"text_input", "parameters"}`` -> ``{"text_output"}``) and ``POST .../generate_stream``
  (server-sent events, one ``data: {...}`` event per chunk of text).

The root ``/v2`` gateway (``_gateway``) hands model paths to the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from michelangelo.lib.serving._binary import HEADER_LENGTH, parse_json, split_body, strict_json
from michelangelo.lib.serving._errors import HTTPError, MethodNotAllowed, NotFound, NotReady
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
GENERATE_EXTENSION = "generate"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


class Answer(NamedTuple):
    """One answer: status, JSON body, and the binary outputs that follow it (if any).

    ``stream`` is set instead of a body for ``generate_stream``: the server-sent events.
    """

    status: int
    body: Any
    tail: bytes = b""
    stream: AsyncIterator[bytes] | None = None


def is_stream_path(path: str) -> bool:
    """Whether ``path`` asks for a streamed answer (``.../generate_stream``)."""
    return path.rstrip("/").endswith("/generate_stream")


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
        text: A :class:`~michelangelo.lib.serving._text.TextModel` for a text model (it
            checks generate requests and streams); ``predict`` then takes and returns text.
    """

    def __init__(self, name: str, info: Mapping[str, Any], signature: Mapping[str, Any],
                 predict: Predict, is_ready: Callable[[], bool] = lambda: True,
                 text: Any = None) -> None:
        self.text = text
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
            return Answer(200, server_metadata(
                EXTENSIONS + ([GENERATE_EXTENSION] if self.text is not None else [])))
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
        if tail in (["generate"], ["generate_stream"]):
            _allow(method, "POST")
            if self.text is None:
                raise NotFound(f"model {self.name!r} is not a text model, so it has no "
                               f"{tail[0]!r}; use 'infer'. Fix: register the model with "
                               "tokenizer= and processing= to serve text.")
            text, params = self.text.generate_request(parse_json(await read_body()))
            self._require_ready()
            if tail == ["generate"]:
                return Answer(200, await self._generate(text, params))
            return Answer(200, None, stream=self._events(text, params))
        paths = "'', 'ready', 'infer', 'generate' or 'generate_stream'" if self.text is not None \
            else "'', 'ready' or 'infer'"
        raise NotFound(f"no path {'/'.join(tail)!r} under model {self.name!r}; use {paths}.")

    async def _generate(self, text: str, params: Mapping[str, Any]) -> dict[str, Any]:
        from michelangelo.lib.serving._text import TEXT_INPUT, TEXT_OUTPUT

        rows = {TEXT_INPUT: np.array([text.encode("utf-8")], dtype=object),
                **{k: np.array([v]) for k, v in params.items()}}
        outputs = await self.predict(rows)
        return {"model_name": self.name, "model_version": self.version,
                "text_output": bytes(outputs[TEXT_OUTPUT][0]).decode("utf-8")}

    async def _events(self, text: str, params: Mapping[str, Any]) -> AsyncIterator[bytes]:
        """One ``data: {...}`` event per chunk; each decoding step runs off the event loop,
        so a client that goes away (the request is cancelled) stops the generation."""
        chunks = self.text.stream(text, params)
        end = object()
        try:
            while True:
                chunk = await asyncio.to_thread(next, chunks, end)
                if chunk is end:
                    break
                yield _event({"model_name": self.name, "model_version": self.version,
                              "text_output": chunk})
        except Exception as exc:  # mid-stream: the status is sent, so say it in an event
            if isinstance(exc, HTTPError):
                yield _event(exc.body())
            else:
                yield _event({"error": f"generation failed: {type(exc).__name__}: {exc}"})
        finally:
            with contextlib.suppress(ValueError):  # still running in its thread: it stops there
                chunks.close()

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


def _event(body: Any) -> bytes:
    return b"data: " + strict_json(body) + b"\n\n"


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise MethodNotAllowed(f"this path takes {allowed}, not {method}.")


def _tensor_meta(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": spec["name"], "datatype": spec["datatype"], "shape": list(spec["shape"])}
