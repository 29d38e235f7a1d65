"""The Ray Serve application behind one endpoint: load, prove, route, batch.

Each replica loads the revision in its constructor (weights, sha256, input example), so
Serve sends it no request before that succeeded. Requests go through :class:`Routes`;
rows from concurrent requests meet in ``serve.batch``, which counts ROWS here (its
``batch_size_fn``), and a request with more rows than ``max_batch_size`` is cut into pieces
that each fit, then put back together, so every caller gets exactly its own rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from michelangelo.errors import ServiceError
from michelangelo.lib.serving._binary import read_body, render
from michelangelo.lib.serving._description import DeploymentDescription
from michelangelo.lib.serving._errors import (
    HTTPError,
    ModelFailed,
    PayloadTooLarge,
    ReadinessError,
)
from michelangelo.lib.serving._gateway import ENDPOINT_DEPLOYMENT
from michelangelo.lib.serving._model import ServedModel
from michelangelo.lib.serving._rollout import CanaryRouter
from michelangelo.lib.serving._routes import SSE_HEADERS, Routes, is_stream_path
from michelangelo.lib.serving._text import TextModel

logger = logging.getLogger("michelangelo.serving")
INGRESS_NAME = ENDPOINT_DEPLOYMENT


def _rows(items: list[dict[str, np.ndarray]]) -> int:
    return sum(len(next(iter(item.values()))) for item in items)


@serve.deployment(name=INGRESS_NAME, max_ongoing_requests=256)
class ModelEndpoint:
    """One replica of an endpoint (built from a :class:`DeploymentDescription` dict)."""

    def __init__(self, description: dict[str, Any]) -> None:
        import torch

        # Replicas share the machine with each other and the proxy: one thread each.
        torch.set_num_threads(1)
        self.description = DeploymentDescription.from_dict(description)
        d = self.description
        from michelangelo.lib.checkpoints import ModelSpec

        spec = ModelSpec(d.project_name, d.model_name, d.revision_id)
        self.served = ServedModel.load(d.registry_url, spec)
        if self.served.info["weights_sha256"] != d.weights_sha256:
            raise ReadinessError(
                f"{d.project_name}/{d.model_name}:{d.revision_id} now records weights sha256 "
                f"{self.served.info['weights_sha256']}, but {d.weights_sha256} was deployed; "
                "the revision was replaced after deploy() resolved it. Fix: deploy again.")
        # A revision registered with a tokenizer and processing spec takes and answers text.
        self.text = (TextModel(self.served, self.served.tokenizer, self.served.processing)
                     if self.served.processing else None)
        self.engine: Any = self.text or self.served
        self._ready = True
        if d.max_batch_size is not None:
            self._batched.set_max_batch_size(d.max_batch_size)
            self._batched.set_batch_wait_timeout_s(d.batch_wait_timeout_s)
        predict = self._predict_batched if d.max_batch_size is not None else self._predict_alone
        if self.text is not None:
            predict = self._text_predict(predict)
        self.routes = Routes(d.name, self.served.info, self.engine.signature, predict,
                             is_ready=lambda: self._ready, text=self.text)
        # A canary beside this revision takes its share of requests through here.
        self.canary = CanaryRouter(d.name, d.revision_id)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        prefix = self.description.route_prefix
        if path.startswith(prefix):
            path = path[len(prefix):]
        headers = {k.lower(): v for k, v in request.headers.items()}
        if is_stream_path(path):
            events = self._stream(request.method, path, headers, lambda: read_body(
                request, self.description.max_request_bytes))
            status, out_headers = await anext(events)
            return StreamingResponse(events, status_code=status, headers=out_headers)
        status, out_headers, content = await self._respond(
            request.method, path, headers,
            lambda: read_body(request, self.description.max_request_bytes))
        return Response(content, status_code=status, headers=out_headers)

    async def answer(self, method: str, path: str, headers: Mapping[str, str],
                     body: bytes) -> tuple[int, dict[str, str], bytes]:
        """One request the root ``/v2`` gateway read and forwards: status, headers, body."""
        return await self._respond(method, path, headers, self._reader(body))

    async def answer_here(self, method: str, path: str, headers: Mapping[str, str],
                          body: bytes) -> tuple[int, dict[str, str], bytes, bool]:
        """A request a stable replica routed to this (canary) one: answered here, never
        routed on, with whether it failed (5xx, or the model raised)."""
        return await self._answer(method, path, headers, self._reader(body))

    async def answer_stream(self, method: str, path: str, headers: Mapping[str, str],
                            body: bytes) -> Any:
        """A streamed request the root gateway forwards (call with ``stream=True``): yields
        ``(status, headers)`` first, then the body's chunks."""
        async for item in self._stream(method, path, headers, self._reader(body)):
            yield item

    async def _stream(self, method: str, path: str, headers: Mapping[str, str],
                      read: Callable[[], Awaitable[bytes]]) -> Any:
        # Streams are answered by the replica that takes them (a canary gets no streams).
        try:
            answer = await self.routes.handle(method, path, read, headers)
        except HTTPError as exc:
            content, out_headers = render(exc.body())
            yield exc.status, out_headers
            yield content
            return
        except Exception as exc:  # never a 500 without a reason
            logger.exception("request on %s failed", path)
            content, out_headers = render({"error": f"the model could not process this "
                                                    f"input: {type(exc).__name__}: {exc}"})
            yield 400, out_headers
            yield content
            return
        if answer.stream is None:
            content, out_headers = render(answer.body, answer.tail)
            yield answer.status, out_headers
            yield content
            return
        yield 200, dict(SSE_HEADERS)
        async for chunk in answer.stream:
            yield chunk

    def _text_predict(self, predict: Callable[[dict[str, np.ndarray]],
                                              Awaitable[dict[str, np.ndarray]]]) -> Any:
        async def run(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return await predict(self.text.prepare(arrays))  # checked before batching

        return run

    def _reader(self, body: bytes) -> Callable[[], Awaitable[bytes]]:
        async def read() -> bytes:
            if len(body) > self.description.max_request_bytes:
                raise PayloadTooLarge.over(len(body), self.description.max_request_bytes)
            return body

        return read

    async def _respond(self, method: str, path: str, headers: Mapping[str, str],
                       read: Callable[[], Awaitable[bytes]]
                       ) -> tuple[int, dict[str, str], bytes]:
        canary = await self.canary.target(method, path)
        if canary is not None:
            try:
                body = await read()
            except Exception as exc:  # answered as any request whose body cannot be read
                error = exc

                async def fail() -> bytes:
                    raise error

                return (await self._answer(method, path, headers, fail))[:3]
            started = time.perf_counter()
            try:
                status, out_headers, content, failed = await canary.answer_here.remote(
                    method, path, headers, body)
            except Exception as exc:  # gone meanwhile (rolled back, promoted): answer here
                logger.warning("the canary of %r could not be reached: %r",
                               self.description.name, exc)
                self.canary.report(True, time.perf_counter() - started)
                read = self._reader(body)
            else:
                self.canary.report(failed, time.perf_counter() - started)
                return status, out_headers, content
        return (await self._answer(method, path, headers, read))[:3]

    async def _answer(self, method: str, path: str, headers: Mapping[str, str],
                      read: Callable[[], Awaitable[bytes]]
                      ) -> tuple[int, dict[str, str], bytes, bool]:
        try:
            answer = await self.routes.handle(method, path, read, headers)
            content, out_headers = render(answer.body, answer.tail)
            return answer.status, out_headers, content, answer.status >= 500
        except HTTPError as exc:
            content, out_headers = render(exc.body())
            return exc.status, out_headers, content, (exc.status >= 500
                                                      or isinstance(exc, ModelFailed))
        except Exception as exc:  # never a 500, never a dead replica: say what went wrong
            logger.exception("request on %s failed", path)
            content, out_headers = render({"error": f"the model could not process this input: "
                                                    f"{type(exc).__name__}: {exc}"})
            return 400, out_headers, content, True

    async def _predict_alone(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await self._run(self.engine.forward, arrays)

    async def _predict_batched(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        size = self.description.max_batch_size or 1
        rows = len(next(iter(arrays.values())))
        if rows <= size:
            return _unwrap(await self._batched(arrays))
        pieces = [{n: a[i:i + size] for n, a in arrays.items()} for i in range(0, rows, size)]
        parts = [_unwrap(p) for p in await asyncio.gather(*(self._batched(p) for p in pieces))]
        return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=_rows)
    async def _batched(self, items: list[dict[str, np.ndarray]]) -> list[Any]:
        try:
            return await self._run(self.engine.forward_many, items)
        except Exception as exc:
            if len(items) == 1:
                return [_as_error(exc)]
        # One request's rows broke the shared pass: answer each alone, so only it fails.
        results: list[Any] = []
        for item in items:
            try:
                results.append(await self._run(self.engine.forward, item))
            except Exception as exc:
                results.append(_as_error(exc))
        return results

    async def _run(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        # A text model's decoding loop runs many forward passes: off the event loop, so the
        # replica keeps answering health checks and streams meanwhile. One pass of another
        # model is short and runs in place (a thread hop would cost more than it saves).
        if self.text is not None:
            return await asyncio.to_thread(fn, arg)
        return fn(arg)

    def describe(self) -> dict[str, Any]:
        """The description and the model this replica serves (for ``get_deployment``)."""
        return {"description": self.description.to_dict(), "model": self.served.info,
                "signature": self.engine.signature,
                "decoding_steps": None if self.text is None else self.text.steps_run}

    def check_health(self) -> None:
        if not self._ready:
            raise ServiceError("model not loaded")


def _as_error(exc: BaseException | None) -> HTTPError:
    if isinstance(exc, HTTPError):
        return exc
    logger.warning("the model raised on a request: %r", exc)
    return ModelFailed(f"the model could not process this input: {type(exc).__name__}: {exc}")


def _unwrap(result: Any) -> dict[str, np.ndarray]:
    if isinstance(result, BaseException):
        raise result
    return result


def build_app(args: dict[str, Any]) -> serve.Application:
    """Serve application builder: ``import_path: michelangelo.lib.serving._app:build_app``."""
    description = DeploymentDescription.from_dict(args["description"])
    return ModelEndpoint.options(
        num_replicas=description.num_replicas,
        # A replica that cannot prove its model will not do better on a second try.
        max_constructor_retry_count=1,
        ray_actor_options={"num_cpus": description.replica_cpus},
    ).bind(description.to_dict())
