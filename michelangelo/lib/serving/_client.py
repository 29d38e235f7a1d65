"""The HTTP side of an endpoint: JSON requests, server-sent events, and the errors they carry.

Nothing here needs Ray: it is what a client of a deployed endpoint runs.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from michelangelo.lib.serving._errors import HTTPError

__all__ = ["plain", "post_json", "reason_of", "stream_events"]


def plain(inputs: Any) -> Any:
    """Arrays and tensors (or a dict of them) as nested lists."""
    if isinstance(inputs, dict):
        return {k: plain(v) for k, v in inputs.items()}
    return inputs.tolist() if hasattr(inputs, "tolist") else inputs


def post_json(url: str, body: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """POST JSON and decode the answer; an error status raises :class:`HTTPError`."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise HTTPError(reason_of(exc.read()), exc.code) from None


def reason_of(payload: bytes) -> str:
    try:
        return json.loads(payload)["error"]
    except (ValueError, KeyError, TypeError):
        return payload.decode(errors="replace")


def stream_events(url: str, body: Any, timeout_s: float = 60.0) -> Iterator[dict[str, Any]]:
    """POST JSON and yield each server-sent event's data as it arrives.

    Closing the iterator early closes the connection.

    Raises:
        HTTPError: The server refused the request, or sent an event with an ``error``.
    """
    request = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        raise HTTPError(reason_of(exc.read()), exc.code) from None
    with response:
        for line in response:
            if line.startswith(b"data: "):
                event = json.loads(line[len(b"data: "):])
                if "error" in event:
                    raise HTTPError(event["error"], 500)
                yield event
