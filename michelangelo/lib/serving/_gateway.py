"""The Open Inference Protocol at the server's root: ``/v2/...`` for every endpoint.

Each endpoint lives under its own prefix ``/{name}``; clients that take only ``host:port``
and a model name (Triton's perf_analyzer, ``tritonclient`` without a base path, load
testers, gateways) ask ``/v2/models/{name}/...`` instead. This Serve application owns the
``/v2`` prefix, answers the server paths itself and hands each model path, body read, to
the endpoint called ``{name}`` through its Serve handle; the endpoint answers exactly as it
does under its own prefix.

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``: server metadata and health.
- ``GET|POST /v2/repository/index``: every endpoint with its revision and state.
- ``/v2/models/{name}[/versions/{rev}][/ready|/infer|/generate|/generate_stream]``: the
  endpoint ``{name}`` (``generate_stream`` is streamed through as it comes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from michelangelo.lib.serving._binary import read_body, render
from michelangelo.lib.serving._errors import HTTPError, MethodNotAllowed, NotFound, NotReady
from michelangelo.lib.serving._routes import EXTENSIONS, is_stream_path, server_metadata

logger = logging.getLogger("michelangelo.serving")
# Deployment names start with a letter or digit, so no endpoint can take this name.
GATEWAY_APP = "_oip"
GATEWAY_PREFIX = "/v2"
GATEWAY_DEPLOYMENT = "OIPGateway"
ENDPOINT_DEPLOYMENT = "ModelEndpoint"
# How long the gateway trusts what it learned about an endpoint (its limit, that it exists).
_FRESH_S = 2.0


@dataclass
class _Endpoint:
    handle: Any
    max_request_bytes: int
    seen_at: float


def is_endpoint(name: str, app: Any) -> bool:
    """Whether a Serve application is a user's endpoint.

    Names starting with ``_`` are ours (this gateway, a revision being proven before it
    takes traffic); deployment names cannot start with it.
    """
    return not name.startswith("_") and ENDPOINT_DEPLOYMENT in getattr(app, "deployments", {})


def app_state(app: Any) -> str:
    """A Serve application's status as text (``"RUNNING"``, ``"DEPLOY_FAILED"``, ...)."""
    return str(getattr(app.status, "value", app.status))


def endpoint_states(applications: dict[str, Any]) -> dict[str, str]:
    """``{name: Serve status}`` of the applications that are endpoints."""
    return {name: app_state(app) for name, app in applications.items()
            if is_endpoint(name, app)}


def _applications() -> dict[str, Any]:
    return serve.status().applications


@serve.deployment(name=GATEWAY_DEPLOYMENT, max_ongoing_requests=1024)
class Gateway:
    """Routes ``/v2/...`` to the endpoint named in the path."""

    def __init__(self) -> None:
        self._endpoints: dict[str, _Endpoint] = {}

    async def __call__(self, request: Request) -> Response:
        parts = [p for p in request.url.path.split("/") if p]
        try:
            if parts[1:2] == ["models"] and len(parts) >= 3 and is_stream_path(request.url.path):
                return await self._forward_stream(request, parts[2])
            if parts[1:2] == ["models"] and len(parts) >= 3:
                status, headers, content = await self._forward(request, parts[2])
            else:
                body = await self._server_path(request.method, parts[1:])
                content, headers = render(body)
                status = 200
        except HTTPError as exc:
            status, (content, headers) = exc.status, render(exc.body())
        except Exception as exc:  # answered, never a 500 without a reason
            logger.exception("gateway request %s failed", request.url.path)
            status, (content, headers) = 503, render(
                {"error": f"the endpoint could not be reached: {type(exc).__name__}: {exc}"})
        return Response(content, status_code=status, headers=headers)

    async def _server_path(self, method: str, rest: list[str]) -> Any:
        if not rest:
            _allow(method, ("GET",))
            return server_metadata([*EXTENSIONS, "model_repository"])
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            _allow(method, ("GET",))
            return {rest[1]: True}
        if rest == ["repository", "index"]:
            _allow(method, ("GET", "POST"))
            return await self._index()
        raise NotFound(f"no Open Inference Protocol path /v2/{'/'.join(rest)}; see GET "
                       "/v2/repository/index for the models served here.")

    async def _index(self) -> list[dict[str, Any]]:
        states = endpoint_states(await asyncio.to_thread(_applications))
        index = []
        for name, state in sorted(states.items()):
            entry: dict[str, Any] = {"name": name, "state": "READY" if state == "RUNNING"
                                     else ("UNAVAILABLE" if "FAIL" in state else "LOADING")}
            if state == "RUNNING":
                try:
                    handle = await asyncio.to_thread(serve.get_app_handle, name)
                    info = await handle.describe.remote()
                    entry["version"] = str(info["description"]["revision_id"])
                except Exception as exc:  # deleted meanwhile: say so, answer the rest
                    entry.update(state="UNAVAILABLE", reason=f"{type(exc).__name__}: {exc}")
            else:
                entry["reason"] = f"Serve reports {state}"
            index.append(entry)
        return index

    async def _forward(self, request: Request, name: str) -> tuple[int, dict[str, str], bytes]:
        endpoint = await self._endpoint(name)
        headers = {k.lower(): v for k, v in request.headers.items()}
        body = await read_body(request, endpoint.max_request_bytes)
        return await endpoint.handle.answer.remote(request.method, request.url.path, headers,
                                                   body)

    async def _forward_stream(self, request: Request, name: str) -> Response:
        endpoint = await self._endpoint(name)
        headers = {k.lower(): v for k, v in request.headers.items()}
        body = await read_body(request, endpoint.max_request_bytes)
        # Cancelled with this request when the client goes away, which stops the replica's.
        chunks = endpoint.handle.options(stream=True).answer_stream.remote(
            request.method, request.url.path, headers, body)
        status, out_headers = await anext(chunks)
        return StreamingResponse(chunks, status_code=status, headers=out_headers)

    async def _endpoint(self, name: str) -> _Endpoint:
        known = self._endpoints.get(name)
        if known is not None and time.monotonic() - known.seen_at < _FRESH_S:
            return known
        states = endpoint_states(await asyncio.to_thread(_applications))
        if name not in states:
            self._endpoints.pop(name, None)
            raise NotFound(f"model {name!r} is not served here; models: "
                           f"{sorted(states) or 'none'}. Fix: use one of those names, or "
                           "deploy the model first.")
        if states[name] != "RUNNING" and known is None:
            raise NotReady(f"model {name!r} is not ready (Serve reports {states[name]}); "
                           "retry shortly.")
        handle = await asyncio.to_thread(serve.get_app_handle, name)
        info = await handle.describe.remote()
        known = _Endpoint(handle, int(info["description"]["max_request_bytes"]),
                          time.monotonic())
        self._endpoints[name] = known
        return known


def _allow(method: str, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        raise MethodNotAllowed(f"this path takes {' or '.join(allowed)}, not {method}.")


def build_gateway(args: dict[str, Any] | None = None) -> serve.Application:
    """Serve application builder: ``michelangelo.lib.serving._gateway:build_gateway``."""
    # It only reads bodies and forwards them: no CPU reserved, so it fits beside any replica.
    return Gateway.options(ray_actor_options={"num_cpus": 0}).bind()


def serve_config_entry() -> dict[str, Any]:
    """The gateway as one application of a Serve config (next to the endpoints)."""
    return {"name": GATEWAY_APP, "route_prefix": GATEWAY_PREFIX,
            "import_path": "michelangelo.lib.serving._gateway:build_gateway", "args": {}}
