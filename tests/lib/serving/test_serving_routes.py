"""Every HTTP path and error class of one endpoint, in process (the same code Serve runs)."""

import asyncio
import json

import numpy as np
import pytest

from michelangelo.lib.serving._errors import HTTPError
from michelangelo.lib.serving._routes import Routes

SIG = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}],
       "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}]}
INFO = {"project_name": "p", "model_name": "m", "revision_id": 3, "weights_sha256": "ab"}


async def _sum_rows(arrays):
    return {"output": arrays["input"].sum(axis=1, keepdims=True)}


def _call(routes, method, path, body=b""):
    async def read():
        return body if isinstance(body, bytes) else json.dumps(body).encode()

    try:
        answer = asyncio.run(routes.handle(method, path, read))
        assert answer.tail == b""
        return answer.status, answer.body
    except HTTPError as exc:
        return exc.status, exc.body()


@pytest.fixture
def routes():
    state = {"ready": True}
    r = Routes("m1", INFO, SIG, _sum_rows, is_ready=lambda: state["ready"])
    r.state = state
    return r


def test_simple_form_and_server_paths(routes):
    status, body = _call(routes, "POST", "/", {"inputs": [[1, 2], [3, 4]]})
    assert status == 200 and body == {"predictions": [[3.0], [7.0]], "model": INFO}
    assert _call(routes, "GET", "/v2") == (200, {"name": "michelangelo", "version": "2",
                                                 "extensions": ["binary_tensor_data"]})
    assert _call(routes, "GET", "/v2/health/live") == (200, {"live": True})
    assert _call(routes, "GET", "/v2/health/ready") == (200, {"ready": True})


@pytest.mark.parametrize("prefix", ["/v2/models/m1", "/v2/models/m1/versions/3"])
def test_model_paths_with_and_without_version(routes, prefix):
    status, meta = _call(routes, "GET", prefix)
    assert status == 200 and meta["name"] == "m1" and meta["versions"] == ["3"]
    assert meta["inputs"] == SIG["inputs"] and meta["outputs"] == SIG["outputs"]
    assert _call(routes, "GET", prefix + "/ready") == (200, {"name": "m1", "ready": True})
    status, out = _call(routes, "POST", prefix + "/infer", {
        "id": "r1", "inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                                "data": [1, 1]}]})
    assert status == 200 and out["id"] == "r1" and out["model_version"] == "3"
    assert out["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [1, 1],
                               "data": [2.0]}]


@pytest.mark.parametrize("method, path, body, status, fragment", [
    ("POST", "/", b"{not json", 400, "not valid JSON"),
    ("POST", "/", b"\xff\xfe", 400, "not valid JSON"),
    ("POST", "/", {"inputs": [[1, 2, 3]]}, 400, "dimension 1 is 3"),
    ("GET", "/", b"", 405, "takes POST"),
    ("GET", "/v2/models/other", b"", 404, "serves 'm1'"),
    ("GET", "/v2/models/m1/versions/2", b"", 404, "serves revision 3"),
    ("POST", "/v2/models/m1/versions/2/infer", b"", 404, "serves revision 3"),
    ("GET", "/v2/models/m1/explain", b"", 404, "no path"),
    ("GET", "/v1/models", b"", 404, "no path"),
    ("GET", "/v2/models/m1/infer", b"", 405, "takes POST"),
])
def test_error_classes(routes, method, path, body, status, fragment):
    got_status, got = _call(routes, method, path, body)
    assert got_status == status and fragment in got["error"], got


def test_not_ready_is_503_on_readiness_and_inference(routes):
    routes.state["ready"] = False
    assert _call(routes, "GET", "/v2/health/ready")[0] == 503
    assert _call(routes, "GET", "/v2/models/m1/ready")[0] == 503
    status, body = _call(routes, "POST", "/", {"inputs": [[1, 2]]})
    assert status == 503 and "not ready" in body["error"]
    assert _call(routes, "GET", "/v2/health/live")[0] == 200


def test_multiple_outputs_come_back_by_name():
    async def two(arrays):
        return {"a": arrays["input"][:, :1], "b": np.ones((len(arrays["input"]), 1))}

    sig = {**SIG, "outputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 1]},
                              {"name": "b", "datatype": "FP64", "shape": [-1, 1]}]}
    status, body = _call(Routes("m", INFO, sig, two), "POST", "", {"inputs": [[5, 6]]})
    assert status == 200 and body["predictions"] == {"a": [[5.0]], "b": [[1.0]]}
