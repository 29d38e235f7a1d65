"""Real Ray Serve on a real standing local cluster, over real HTTP on 127.0.0.1.

One cluster and one Serve instance for the whole module (starting them is the slow part);
the tests share two endpoints and redeploy one of them.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest
import serving_models
from click.testing import CliRunner

from michelangelo.lib import serving
from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray import standing as standing_cluster
from michelangelo.uniflow.plugins.ray.provisioning import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_BATCH = 8


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    saved = {k: os.environ.get(k) for k in ("MA_CLUSTER_FILE", "PYTHONPATH")}
    os.environ["MA_CLUSTER_FILE"] = str(root / "cluster.json")
    # Replicas import the test models' factories by module name, as a user's package would be.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, saved["PYTHONPATH"]) if p)
    registry = ModelRegistry(str(root / "registry"))
    specs = {"rows1": serving_models.register_row_linear(registry, seed=0),
             "rows2": serving_models.register_row_linear(registry, seed=1),
             "drifting": serving_models.register_drifting(registry),
             "rows3": serving_models.register_row_linear(registry, seed=3),
             "brittle": serving_models.register_brittle(registry)}
    standing = standing_cluster.up(RayTask(head_cpu=3, head_memory="3Gi"))
    port = free_port()
    try:
        busy_error = _deploy_on_a_held_port(registry, specs["rows1"])
        rows = serving.deploy(specs["rows1"], name="rows", registry=registry, port=port,
                              max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.05,
                              max_request_bytes=64 * 1024)
        yield {"registry": registry, "specs": specs, "standing": standing, "rows": rows,
               "port": port, "busy_error": busy_error}
    finally:
        import ray

        ray.shutdown()
        standing_cluster.down()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _deploy_on_a_held_port(registry, spec):
    """Deploy while another socket listens on the asked port; return the error raised."""
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", free_port()))
    held.listen()
    try:
        with pytest.raises(serving.DeploymentError) as caught:
            serving.deploy(spec, name="held", registry=registry, port=held.getsockname()[1])
        return caught.value, held.getsockname()[1]
    finally:
        held.close()


def _request(method, url, body=None, raw=None, timeout=60):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            return exc.code, json.loads(payload)
        except ValueError:
            return exc.code, {"raw": payload.decode(errors="replace")}


def _expected(registry, spec, x):
    weights = registry.load_state_dict(spec)
    return x @ weights["linear.weight"].numpy().T + weights["linear.bias"].numpy()


def test_a_port_already_held_is_refused_clearly_and_serve_can_start_elsewhere(env):
    error, held = env["busy_error"]
    assert f"127.0.0.1:{held}" in str(error) and "another port=" in str(error)
    # The fixture's deploy after that error started Serve on the free port.
    assert serving.get_deployment("rows").base_url == f"http://127.0.0.1:{env['port']}"


def test_simple_form_and_deployment_handle(env):
    rows, registry = env["rows"], env["registry"]
    assert rows.url == f"http://127.0.0.1:{env['port']}/rows"
    assert rows.spec.revision_id == 1
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    status, body = _request("POST", rows.url, {"inputs": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["predictions"]["y"], _expected(registry, rows.spec, x),
                               rtol=1e-5)
    assert body["model"] == {"project_name": "serving", "model_name": "rows", "revision_id": 1,
                             "weights_sha256": registry.get(rows.spec).weights_sha256}
    assert rows.predict(x)["y"] == body["predictions"]["y"]
    assert rows.curl(x[:1]).startswith(f"curl -s -X POST {rows.url} ")


def test_open_inference_protocol_paths(env):
    url, rev = env["rows"].url, "1"
    assert _request("GET", f"{url}/v2/health/live") == (200, {"live": True})
    assert _request("GET", f"{url}/v2/health/ready") == (200, {"ready": True})
    assert _request("GET", f"{url}/v2")[1]["name"] == "michelangelo"
    for model in ("/v2/models/rows", f"/v2/models/rows/versions/{rev}"):
        status, meta = _request("GET", url + model)
        assert status == 200 and meta["versions"] == [rev]
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
        assert [o["name"] for o in meta["outputs"]] == ["y", "batch_rows"]
        assert _request("GET", url + model + "/ready") == (200, {"name": "rows", "ready": True})
        status, out = _request("POST", url + model + "/infer", {
            "id": "a1", "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                    "data": [1, 2, 3, 4]}], "outputs": [{"name": "y"}]})
        assert status == 200 and out["id"] == "a1" and out["model_version"] == rev
        assert [(o["name"], o["datatype"], o["shape"]) for o in out["outputs"]] == [
            ("y", "FP32", [1, 1])]


def test_the_protocol_at_the_server_root_dispatches_by_model_name(env):
    base, rows = f"http://127.0.0.1:{env['port']}", env["rows"]
    assert _request("GET", f"{base}/v2/health/live") == (200, {"live": True})
    assert _request("GET", f"{base}/v2/health/ready") == (200, {"ready": True})
    status, meta = _request("GET", f"{base}/v2")
    assert status == 200 and "binary_tensor_data" in meta["extensions"]
    for method in ("GET", "POST"):
        assert _request(method, f"{base}/v2/repository/index") == (
            200, [{"name": "rows", "state": "READY", "version": "1"}])
    for model in ("/v2/models/rows", "/v2/models/rows/versions/1"):
        assert _request("GET", base + model) == _request("GET", rows.url + model)
        assert _request("GET", base + model + "/ready") == (200, {"name": "rows", "ready": True})
        status, out = _request("POST", base + model + "/infer", {
            "id": "r", "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}], "outputs": [{"name": "y"}]})
        assert status == 200 and out["id"] == "r" and out["outputs"][0]["shape"] == [1, 1]
    assert rows.root_infer_url == f"{base}/v2/models/rows/infer"
    for path, method, status, fragment in [
            ("/v2/models/nope/infer", "POST", 404, "models: ['rows']"),
            ("/v2/models/rows/versions/9/ready", "GET", 404, "serves revision 1"),
            ("/v2/models/rows/infer", "GET", 405, "takes POST"),
            ("/v2/health/live", "POST", 405, "takes GET"),
            ("/v2/nothing", "GET", 404, "repository/index")]:
        got, answer = _request(method, base + path, body={} if method == "POST" else None)
        assert got == status and fragment in answer["error"], (path, answer)
    big = {"inputs": [{"name": "input", "shape": [4000, 4], "datatype": "FP32",
                       "data": [0.5] * 16000}]}
    got, answer = _request("POST", f"{base}/v2/models/rows/infer", big)
    assert got == 413 and "max_request_bytes=65536" in answer["error"]


def test_the_root_dispatches_among_several_deployments_and_forgets_deleted_ones(env):
    base, registry = f"http://127.0.0.1:{env['port']}", env["registry"]
    other = serving.deploy(env["specs"]["rows2"], name="other", registry=registry,
                           port=env["port"])
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}], "outputs": [{"name": "y"}]}
    try:
        status, index = _request("GET", f"{base}/v2/repository/index")
        assert status == 200 and [(m["name"], m["version"]) for m in index] == [
            ("other", "2"), ("rows", "1")]
        for name, spec in (("rows", env["rows"].spec), ("other", other.spec)):
            status, out = _request("POST", f"{base}/v2/models/{name}/infer", body)
            assert status == 200 and out["model_name"] == name
            np.testing.assert_allclose(out["outputs"][0]["data"],
                                       _expected(registry, spec, x).reshape(-1), rtol=1e-5)
    finally:
        other.delete()
    status, answer = _request("POST", f"{base}/v2/models/other/infer", body, timeout=30)
    assert status in (404, 503) and "other" in answer["error"], answer
    time.sleep(2.5)  # past the gateway's memory of what it has seen
    status, answer = _request("POST", f"{base}/v2/models/other/infer", body, timeout=30)
    assert status == 404 and "models: ['rows']" in answer["error"], answer


def _strict(payload):
    def refuse(token):
        raise ValueError(f"bare {token} in the answer")

    return json.loads(payload, parse_constant=refuse)


def test_tritonclient_with_its_defaults_over_host_and_port(env):
    import tritonclient.http as triton

    registry, spec = env["registry"], env["rows"].spec
    client = triton.InferenceServerClient(f"127.0.0.1:{env['port']}")  # no base path
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("rows") and client.is_model_ready("rows", "1")
        meta = client.get_model_metadata("rows")
        assert meta["versions"] == ["1"] and meta["inputs"][0]["datatype"] == "FP32"
        assert [m["name"] for m in client.get_model_repository_index()] == ["rows"]
        x = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)  # binary, the client's default
        result = client.infer("rows", [tensor])  # no outputs named: all come back binary
        assert result.get_output("y")["parameters"]["binary_data_size"] == 5 * 4
        np.testing.assert_allclose(result.as_numpy("y"), _expected(registry, spec, x),
                                   rtol=1e-5, atol=1e-6)
        assert result.as_numpy("batch_rows").dtype == np.int64
        asked = [triton.InferRequestedOutput("y", binary_data=False)]
        result = client.infer("rows", [tensor], outputs=asked, model_version="1")
        assert result.get_output("y")["data"] == pytest.approx(
            _expected(registry, spec, x).reshape(-1).tolist(), rel=1e-5)
        bad = triton.InferInput("input", [1, 4], "FP32")
        bad.set_data_from_numpy(np.array([[0, 1, np.nan, 3]], dtype=np.float32))
        with pytest.raises(triton.InferenceServerException, match=r"position \[0, 2\]"):
            client.infer("rows", [bad])
    finally:
        client.close()


def test_binary_under_the_prefix_and_non_finite_json_is_refused_in_strict_json(env):
    rows = env["rows"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = json.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", env["port"], timeout=60)
    try:
        conn.request("POST", "/rows/v2/models/rows/infer", body=header + x.tobytes(),
                     headers={"Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        content = resp.read()
        assert resp.status == 200, content
        size = int(resp.getheader("Inference-Header-Content-Length"))
        answer = _strict(content[:size])
        y = answer["outputs"][0]
        assert y["name"] == "y" and y["parameters"] == {"binary_data_size": 8}
        np.testing.assert_allclose(np.frombuffer(content[size:size + 8], dtype="<f4"),
                                   _expected(env["registry"], rows.spec, x).reshape(-1),
                                   rtol=1e-5)
    finally:
        conn.close()
    for raw, shown in [(b"NaN", "NaN at position [0, 1]"),
                       (b"1e400", "Infinity (or a number too large for the datatype) at "
                                  "position [0, 1]")]:
        body = b'{"inputs": [[1.0, ' + raw + b', 2.0, 3.0]]}'
        for url in (rows.url, f"{rows.base_url}/v2/models/rows/infer"):
            data = body if url == rows.url else (
                b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", '
                b'"data": [1.0, ' + raw + b", 2.0, 3.0]}]}")
            req = urllib.request.Request(url, data=data, method="POST")
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(req, timeout=60)
            assert caught.value.code == 400
            error = _strict(caught.value.read())["error"]
            assert "input 'input'" in error and shown in error, error


@pytest.mark.parametrize("path, body, status, fragment", [
    ("", b"{oops", 400, "not valid JSON"),
    ("", {"inputs": [[1, 2, 3]]}, 400, "dimension 1 is 3"),
    ("/v2/models/rows/infer", {"inputs": [{"name": "nope", "shape": [1, 4], "datatype": "FP32",
                                           "data": [1, 2, 3, 4]}]}, 400, "unknown input"),
    ("/v2/models/rows/infer", {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "INT8",
                                           "data": [1, 2, 3, 4]}]}, 400, "registered 'FP32'"),
    ("/v2/models/other/infer", {"inputs": []}, 404, "serves 'rows'"),
    ("/v2/models/rows/versions/7/infer", {"inputs": []}, 404, "serves revision 1"),
    ("", {"inputs": [[0.5] * 4] * 4000}, 413, "max_request_bytes=65536"),
])
def test_errors_are_4xx_with_a_reason_and_the_replica_survives(env, path, body, status, fragment):
    raw = body if isinstance(body, bytes) else None
    got, answer = _request("POST", env["rows"].url + path,
                           body=None if raw is not None else body, raw=raw)
    assert got == status and fragment in answer["error"], answer
    assert _request("POST", env["rows"].url, {"inputs": [[0, 0, 0, 0]]})[0] == 200


def test_chunked_body_over_the_limit_is_413(env):
    conn = http.client.HTTPConnection("127.0.0.1", env["port"], timeout=60)
    chunks = (b"[" + b"0.5," * 2000 + b"0.5]" for _ in range(12))  # ~96 KiB, no length given
    conn.request("POST", "/rows", body=chunks, encode_chunked=True,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and "max_request_bytes" in json.loads(resp.read())["error"]
    conn.close()


def test_batching_counts_rows_and_returns_each_request_its_rows(env):
    url, registry, spec = env["rows"].url, env["registry"], env["rows"].spec
    results, errors = [], []

    def client(index):
        rng = np.random.default_rng(index)
        for _ in range(4):
            x = rng.normal(size=(int(rng.integers(1, 6)), 4)).astype(np.float32)
            status, body = _request("POST", url, {"inputs": x.tolist()})
            if status != 200:
                errors.append(body)
            else:
                results.append((x, body["predictions"]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    merged = 0
    for x, predictions in results:
        np.testing.assert_allclose(predictions["y"], _expected(registry, spec, x), rtol=1e-5,
                                   atol=1e-6)
        sizes = {row[0] for row in predictions["batch_rows"]}
        assert len(sizes) == 1 and len(x) <= sizes.pop() <= MAX_BATCH
        merged += predictions["batch_rows"][0][0] > len(x)
    assert merged > 0, "no request shared a forward pass with another"
    # More rows than max_batch_size: cut into passes of at most MAX_BATCH, put back in order.
    big = np.arange(20 * 4, dtype=np.float32).reshape(20, 4)
    status, body = _request("POST", url, {"inputs": big.tolist()})
    assert status == 200 and len(body["predictions"]["y"]) == 20
    np.testing.assert_allclose(body["predictions"]["y"], _expected(registry, spec, big),
                               rtol=1e-5)
    assert max(r[0] for r in body["predictions"]["batch_rows"]) <= MAX_BATCH


def _sse(response):
    """Server-sent events read line by line as they arrive: the ``data:`` payloads."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: "):]))
            yield events[-1]
        else:
            assert line == "", line  # events are separated by one blank line


def _decoding_steps(name):
    from ray import serve

    return serve.get_app_handle(name).describe.remote().result(timeout_s=60)["decoding_steps"]


def test_a_text_model_takes_text_batches_prompts_and_streams_over_http(env):
    import requests
    import tritonclient.http as triton

    registry, base = env["registry"], f"http://127.0.0.1:{env['port']}"
    spec = serving_models.register_text_model(registry, max_tokens_limit=100_000)
    chars = serving.deploy(spec, name="chars", registry=registry, port=env["port"],
                           max_batch_size=8, batch_wait_timeout_s=0.05)
    prompts = ["a", "the keeper wrote", "fog in the bay, the light was lit", "hello there"]
    try:
        # Alone first, then all at once from threads: each gets exactly its own continuation.
        alone = {}
        for p in prompts:
            status, out = _request("POST", f"{base}/v2/models/chars/generate",
                                   {"text_input": p, "parameters": {"max_tokens": 10}})
            assert status == 200 and len(out["text_output"]) == 10, out
            alone[p] = out["text_output"]
        assert len(set(alone.values())) > 1
        together, errors = {}, []

        def ask(p, path):
            status, out = _request("POST", path, {"text_input": p,
                                                  "parameters": {"max_tokens": 10}})
            (together.setdefault(p, []).append(out["text_output"]) if status == 200
             else errors.append(out))

        threads = [threading.Thread(target=ask, args=(p, url)) for p in prompts for url in
                   (f"{base}/v2/models/chars/generate", f"{chars.url}/v2/models/chars/generate")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and together == {p: [alone[p]] * 2 for p in prompts}
        # The simple form and BYTES through the real tritonclient with its defaults.
        status, out = _request("POST", chars.url, {"inputs": prompts[:2]})
        assert status == 200 and [len(t) for t in out["predictions"]] == [8, 8]
        client = triton.InferenceServerClient(f"127.0.0.1:{env['port']}")
        try:
            meta = client.get_model_metadata("chars")
            assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}]
            assert meta["outputs"][0]["datatype"] == "BYTES"
            tensor = triton.InferInput("text_input", [2], "BYTES")
            tensor.set_data_from_numpy(np.array([p.encode() for p in prompts[:2]], dtype=object))
            result = client.infer("chars", [tensor])
            assert [t.decode() for t in result.as_numpy("text_output")] == out["predictions"]
        finally:
            client.close()
        # generate_stream: one event per token, ends cleanly, at the root and under the prefix.
        for url in (f"{base}/v2/models/chars/generate_stream",
                    f"{chars.url}/v2/models/chars/generate_stream"):
            with requests.post(url, json={"text_input": prompts[1],
                                          "parameters": {"max_tokens": 10}},
                               stream=True, timeout=120) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                events = list(_sse(response))
            assert len(events) == 10 and all(e["model_name"] == "chars" for e in events)
            assert "".join(e["text_output"] for e in events) == alone[prompts[1]]
            bad = requests.post(url, json={"text_input": "a", "parameters": {"max_tokens": -1}},
                                timeout=60)
            assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]
        # The Python face: Deployment.generate / generate_stream, errors with the reason.
        assert chars.generate(prompts[1], max_tokens=10) == alone[prompts[1]]
        assert "".join(chars.generate_stream(prompts[1], max_tokens=10)) == alone[prompts[1]]
        with pytest.raises(serving.HTTPError, match="temperature") as caught:
            list(chars.generate_stream("a", temperature="hot"))
        assert caught.value.status == 400
        # A client that goes away mid-stream stops the generation (100000 tokens asked).
        for url in (f"{chars.url}/v2/models/chars/generate_stream",
                    f"{base}/v2/models/chars/generate_stream"):
            before = _decoding_steps("chars")
            response = requests.post(url, json={"text_input": "fog",
                                                "parameters": {"max_tokens": 100_000}},
                                     stream=True, timeout=120)
            events = _sse(response)
            assert next(events)["text_output"] and next(events)["text_output"]
            response.close()
            steps, deadline = _decoding_steps("chars"), time.monotonic() + 180
            while time.monotonic() < deadline:
                time.sleep(3)
                now = _decoding_steps("chars")
                if now == steps:
                    break
                steps = now
            assert steps == _decoding_steps("chars"), "the generation went on after the client left"
            assert steps - before < 50_000, steps - before
    finally:
        chars.delete()


def test_failed_readiness_fails_the_deploy_with_the_reason(env):
    from ray import serve

    from michelangelo.lib.serving._gateway import GATEWAY_APP, GATEWAY_PREFIX, build_gateway

    # As on a first deploy, no /v2 gateway runs yet: the deploy starts one beside the endpoint
    # and, when the endpoint fails, removes it again.
    serve.delete(GATEWAY_APP)
    try:
        with pytest.raises(serving.DeploymentError, match="differs from the one recorded"):
            serving.deploy(env["specs"]["drifting"], name="drifting", registry=env["registry"],
                           port=env["port"])
        assert "drifting" not in [d.name for d in serving.list_deployments()]
        assert not {"drifting", GATEWAY_APP} & set(serve.status().applications)
    finally:  # the module's other tests use the gateway
        serve.run(build_gateway(), name=GATEWAY_APP, route_prefix=GATEWAY_PREFIX)
    base = f"http://127.0.0.1:{env['port']}"
    assert _request("GET", f"{base}/v2/health/ready") == (200, {"ready": True})


class _SteadyStream:
    """Two clients sending one row after another: one on the endpoint's prefix, one at the
    server's root. Records each answer's revision and every failure."""

    def __init__(self, env):
        root = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                            "data": [1, 2, 3, 4]}]}
        self.targets = [(env["rows"].url, {"inputs": [[1, 2, 3, 4]]}),
                        (env["rows"].root_infer_url, root)]
        self.stop, self.seen, self.failures = threading.Event(), [], []
        self.threads = [threading.Thread(target=self._run, args=t) for t in self.targets]

    def _run(self, url, body):
        while not self.stop.is_set():
            status, answer = _request("POST", url, body)
            if status != 200:
                self.failures.append((url, status, answer))
            elif "model" in answer:
                self.seen.append(answer["model"]["revision_id"])
            else:
                self.seen.append(int(answer["model_version"]))
            time.sleep(0.01)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def wait_for(self, done, timeout=60):
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def test_a_redeploy_that_fails_readiness_takes_no_traffic_under_load(env):
    from ray import serve

    with _SteadyStream(env) as stream:
        stream.wait_for(lambda: len(stream.seen) >= 10)
        with pytest.raises(serving.DeploymentError,
                           match="failed readiness.*keeps serving.*differs from the one"):
            serving.deploy(env["specs"]["drifting"], name="rows", registry=env["registry"],
                           port=env["port"], max_batch_size=MAX_BATCH,
                           batch_wait_timeout_s=0.05, max_request_bytes=64 * 1024)
        after = len(stream.seen)
        stream.wait_for(lambda: len(stream.seen) >= after + 20)
    assert stream.failures == []
    assert set(stream.seen) == {1} and len(stream.seen) >= after + 20
    assert serving.get_deployment("rows").spec.revision_id == 1
    assert [d.name for d in serving.list_deployments()] == ["rows"]
    assert [n for n in serve.status().applications if n.startswith("_candidate")] == []


def test_redeploy_swaps_the_revision_with_zero_failed_requests(env):
    with _SteadyStream(env) as stream:
        # Moving an alias and deploying it again is how a new champion goes live.
        env["registry"].set_alias("serving", "rows", "champion", env["specs"]["rows2"].revision_id)
        swapped = serving.deploy("serving/rows@champion", name="rows", registry=env["registry"],
                                 port=env["port"], max_batch_size=MAX_BATCH,
                                 batch_wait_timeout_s=0.05, max_request_bytes=64 * 1024)
        stream.wait_for(lambda: stream.seen[-20:].count(2) == 20)
    assert stream.failures == []
    assert swapped.spec.revision_id == 2 and 1 in stream.seen and stream.seen[-1] == 2
    assert serving.get_deployment("rows").spec.revision_id == 2


def _answered_by(url, body):
    """One request: (status, the revision that answered or the error)."""
    status, answer = _request("POST", url, body)
    if status != 200:
        return status, answer.get("error")
    return status, (answer["model"]["revision_id"] if "model" in answer
                    else int(answer["model_version"]))


def _canary_apps():
    from ray import serve

    return [n for n in serve.status().applications if n.startswith(("_canary", "_candidate"))]


def _wait(done, timeout=60):
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)
    return done()


ROOT_ROW = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                        "data": [1, 2, 3, 4]}]}


def test_a_canary_takes_its_share_on_both_paths_then_rolls_back(env):
    registry, rows = env["registry"], env["rows"]
    stable = serving.get_deployment("rows").spec.revision_id
    canary = env["specs"]["rows3"].revision_id
    with pytest.raises(serving.DeploymentNotFoundError, match="no deployment 'nope'"):
        serving.deploy(env["specs"]["rows3"], name="nope", registry=registry, canary=0.2)
    with pytest.raises(serving.DeploymentError, match="serves serving/rows, not serving/drifting"):
        serving.deploy(env["specs"]["drifting"], name="rows", registry=registry, canary=0.2)
    with pytest.raises(ValueError, match=f"serves revision {stable}, not 1"):
        serving.deploy(env["specs"]["rows3"], name="rows", registry=registry,
                       traffic={1: 0.8, canary: 0.2})
    with pytest.raises(serving.DeploymentError, match="no canary to promote"):
        serving.promote("rows")

    deployed = serving.deploy(env["specs"]["rows3"], name="rows", registry=registry, canary=0.2)
    assert deployed.spec.revision_id == stable and deployed.url == rows.url
    assert (deployed.rollout.stable_revision, deployed.rollout.canary_revision,
            deployed.rollout.canary_share, deployed.rollout.state) == (
                stable, canary, 0.2, "canary")
    # Requests one after another, alternating the endpoint's prefix and the server's root:
    # each replica routes exactly every fifth request it takes to the canary.
    seen = {"prefix": [], "root": []}
    for i in range(200):
        path, url, body = (("prefix", rows.url, {"inputs": [[1, 2, 3, 4]]}) if i % 2 == 0
                           else ("root", rows.root_infer_url, ROOT_ROW))
        status, revision = _answered_by(url, body)
        assert status == 200, revision
        seen[path].append(revision)
    answers = seen["prefix"] + seen["root"]
    assert set(answers) == {stable, canary} and canary in seen["prefix"] and canary in seen["root"]
    share = answers.count(canary) / len(answers)
    assert abs(share - 0.2) <= 0.05, share
    # A path naming a revision reaches that revision.
    for revision in (stable, canary):
        for _ in range(3):
            assert _answered_by(f"{rows.url}/v2/models/rows/versions/{revision}/infer",
                                ROOT_ROW) == (200, revision)
    # Deploying the same canary again (here in the traffic form) only moves its share.
    moved = serving.deploy(env["specs"]["rows3"], name="rows", registry=registry,
                           traffic={stable: 0.5, canary: 0.5})
    assert moved.rollout.canary_share == 0.5 and moved.rollout.canary_requests >= 40

    rolled = serving.rollback("rows")
    assert rolled.state == "rolled_back" and "by hand" in rolled.reason
    assert _canary_apps() == []
    assert {_answered_by(rows.url, {"inputs": [[1, 2, 3, 4]]})[1] for _ in range(20)} == {stable}
    with pytest.raises(serving.DeploymentError, match=r"no canary to promote: revision \d+ was "
                                                      r"rolled back \(rolled back by hand"):
        serving.promote("rows")


def test_a_failing_canary_is_rolled_back_automatically_with_the_reason(env):
    from michelangelo.cli._main import cli

    rows, brittle = env["rows"], env["specs"]["brittle"]
    stable = serving.get_deployment("rows").spec.revision_id
    serving.deploy(brittle, name="rows", registry=env["registry"], canary=0.5,
                   auto_rollback=serving.AutoRollback(max_error_rate=0.2, window=10))
    large = {"inputs": [[30, 30, 30, 30]]}  # the canary's model raises on these
    failures, rollout = [], None
    for i in range(400):
        status, answer = _answered_by(rows.url, large)
        if status != 200:
            assert status == 400 and "outside the range" in answer, answer
            failures.append(i)
        if i % 10 == 9:
            rollout = serving.get_deployment("rows").rollout
            if rollout.state == "rolled_back":
                break
    assert rollout.state == "rolled_back", rollout
    assert "automatic rollback: error rate" in rollout.reason
    assert "above max_error_rate=0.2" in rollout.reason
    assert rollout.canary_failures >= 3 and failures
    assert _wait(lambda: _canary_apps() == [])
    assert {_answered_by(rows.url, large) for _ in range(20)} == {(200, stable)}
    shown = CliRunner().invoke(cli, ["deployments", "status", "rows"])
    assert shown.exit_code == 0 and "rolled back" in shown.output, shown.output
    assert "automatic rollback: error rate" in shown.output


def test_zero_failed_requests_across_canary_rollback_failed_redeploy_and_promote(env):
    from michelangelo.cli._main import cli

    registry, new = env["registry"], env["specs"]["rows3"]
    with _SteadyStream(env) as stream:
        serving.deploy(new, name="rows", registry=registry, canary=0.3)
        stream.wait_for(lambda: stream.seen.count(new.revision_id) >= 5)
        rolled = CliRunner().invoke(cli, ["deployments", "rollback", "rows"])
        assert rolled.exit_code == 0 and "rolled back" in rolled.output, rolled.output
        serving.deploy(new, name="rows", registry=registry, canary=0.3)
        with pytest.raises(serving.DeploymentError, match="failed readiness.*keeps serving"):
            serving.deploy(env["specs"]["drifting"], name="rows", registry=registry,
                           port=env["port"])
        assert serving.get_deployment("rows").rollout.state == "canary"
        promoted = CliRunner().invoke(cli, ["deployments", "promote", "rows"])
        assert promoted.exit_code == 0, promoted.output
        assert f"serves serving/rows:{new.revision_id}" in promoted.output
        stream.wait_for(lambda: stream.seen[-20:].count(new.revision_id) == 20)
    assert stream.failures == []
    assert new.revision_id in stream.seen and stream.seen[-1] == new.revision_id
    after = serving.get_deployment("rows")
    assert after.spec.revision_id == new.revision_id and after.rollout is None
    assert _canary_apps() == []
    again = CliRunner().invoke(cli, ["deployments", "promote", "rows"])
    assert again.exit_code == 1 and "no canary to promote" in again.output, again.output


def test_cli_lists_and_deletes_deployments(env):
    from michelangelo.cli._main import cli

    listed = CliRunner().invoke(cli, ["deployments", "list"])
    assert listed.exit_code == 0 and "rows\tserving/rows:" in listed.output, listed.output
    missing = CliRunner().invoke(cli, ["deployments", "delete", "nope"])
    assert missing.exit_code == 1 and "no deployment 'nope'" in missing.output
    deleted = CliRunner().invoke(cli, ["deployments", "delete", "rows"])
    assert deleted.exit_code == 0, deleted.output
    assert serving.list_deployments() == []
    with pytest.raises(serving.DeploymentNotFoundError):
        serving.get_deployment("rows")


def test_cluster_down_leaves_no_process(env):
    import ray

    ray.shutdown()
    standing = env["standing"]
    assert standing_cluster.find() == standing
    standing_cluster.down()
    assert standing_cluster.find() is None and not os.path.exists(standing_cluster.state_file())
    left = [p.pid for p in psutil.process_iter()
            if _sid(p.pid) in set(standing.node_pids)]
    assert left == []


def _sid(pid):
    try:
        return os.getsid(pid)
    except OSError:
        return None
