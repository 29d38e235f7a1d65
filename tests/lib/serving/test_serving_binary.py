"""The binary tensor extension and strict JSON, in process (the code Serve runs).

Requests are built and answers read by the real ``tritonclient.http`` with its defaults, so
the bytes on both sides are the client's own; the HTTP round trip is in
``test_serving_endpoint.py``.
"""

import asyncio
import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton

from michelangelo.lib.serving._binary import render
from michelangelo.lib.serving._errors import BadRequest, HTTPError
from michelangelo.lib.serving._oip import decode_infer, decode_simple, encode_infer_outputs
from michelangelo.lib.serving._routes import Routes

INFO = {"project_name": "p", "model_name": "m", "revision_id": 1, "weights_sha256": "ab"}
# Every datatype the endpoint takes, with a numpy array tritonclient accepts for it.
ARRAYS = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], dtype=np.float16),
    "BF16": np.array([[-1.5, 0.0, 3.0e38]], dtype=ml_dtypes.bfloat16),
    "FP32": np.array([[-1.5, 1e-30, 3.0e38]], dtype=np.float32),
    "FP64": np.array([[-1.5, 1e-300, 1e300]], dtype=np.float64),
    "BYTES": np.array([[b"", "h\u00e9llo".encode(), b"\x00\xff raw"]], dtype=object),
}


def _sig(datatype, allow=False):
    entry = {"name": "x", "datatype": datatype, "shape": [-1, 3]}
    if allow:
        entry["allow_non_finite"] = True
    return {"inputs": [entry], "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]}


async def _echo(arrays):
    return {"y": arrays["x"]}


def _triton_request(array, datatype, outputs=None, binary=True):
    tensor = triton.InferInput("x", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=outputs)
    return body, ({} if json_size is None else
                  {"inference-header-content-length": str(json_size)})


def _answer(routes, body, headers, path="/v2/models/m/infer"):
    async def read():
        return body

    try:
        answer = asyncio.run(routes.handle("POST", path, read, headers))
    except HTTPError as exc:
        return exc.status, render(exc.body())
    return answer.status, render(answer.body, answer.tail)


def _triton_result(content, headers):
    return triton.InferResult.from_response_body(
        content, header_length=headers.get("inference-header-content-length"))


@pytest.mark.parametrize("datatype", sorted(ARRAYS))
def test_every_datatype_round_trips_in_binary_with_tritonclient_defaults(datatype):
    routes = Routes("m", INFO, _sig(datatype), _echo)
    array = ARRAYS[datatype]
    status, (content, headers) = _answer(routes, *_triton_request(array, datatype))
    assert status == 200, content
    assert headers["content-type"] == "application/octet-stream"
    result = _triton_result(content, headers)
    got = result.as_numpy("y")
    # BF16 arrives as float32 for the model and leaves as FP32 (numpy has no bfloat16).
    want = array.astype(np.float32) if datatype == "BF16" else array
    assert result.get_output("y")["datatype"] == ("FP32" if datatype == "BF16" else datatype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_json_and_binary_mix_per_output_and_json_only_answers_are_json():
    sig = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
           "outputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 2]},
                       {"name": "b", "datatype": "INT64", "shape": [-1, 1]}]}

    async def two(arrays):
        return {"a": arrays["x"] * 2, "b": np.arange(len(arrays["x"]))[:, None]}

    routes = Routes("m", INFO, sig, two)
    x = np.array([[1, 2], [3, 4]], dtype=np.float32)
    asked = [triton.InferRequestedOutput("a"), triton.InferRequestedOutput("b", binary_data=False)]
    status, (content, headers) = _answer(routes, *_triton_request(x, "FP32", outputs=asked))
    assert status == 200
    result = _triton_result(content, headers)
    np.testing.assert_array_equal(result.as_numpy("a"), x * 2)
    assert result.get_output("b")["data"] == [0, 1]
    # JSON in, no binary asked for: plain JSON out, no header.
    status, (content, headers) = _answer(routes, *_triton_request(
        x, "FP32", outputs=[triton.InferRequestedOutput("a", binary_data=False)], binary=False))
    assert status == 200 and "inference-header-content-length" not in headers
    assert json.loads(content)["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.parametrize("mangle, fragment", [
    (lambda body, size: (body, {"inference-header-content-length": "x"}), "is 'x'"),
    (lambda body, size: (body, {"inference-header-content-length": str(len(body) + 1)}),
     "the body has"),
    (lambda body, size: (body[:-4], {"inference-header-content-length": size}),
     "bytes of binary data are left"),
    (lambda body, size: (body + b"\0" * 4, {"inference-header-content-length": size}),
     "no input claims"),
    (lambda body, size: (body, {}), "not valid JSON"),
])
def test_malformed_binary_requests_are_400_with_the_reason(mangle, fragment):
    routes = Routes("m", INFO, _sig("FP32"), _echo)
    body, headers = _triton_request(ARRAYS["FP32"], "FP32")
    status, (content, _) = _answer(routes, *mangle(body, headers["inference-header-content-length"]))
    assert status == 400 and fragment in json.loads(content)["error"], content


def test_binary_size_must_match_shape_and_bools_must_be_0_or_1():
    header = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                          "parameters": {"binary_data_size": 8}}]}
    with pytest.raises(BadRequest, match="needs 12 bytes"):
        decode_infer(header, _sig("FP32"), b"\0" * 8)
    header["inputs"][0].update(datatype="BOOL", parameters={"binary_data_size": 3})
    with pytest.raises(BadRequest, match="bytes 0 or 1"):
        decode_infer(header, _sig("BOOL"), b"\x01\x02\x00")
    header["inputs"][0]["parameters"] = {"binary_data_size": -1}
    with pytest.raises(BadRequest, match="non-negative integer"):
        decode_infer(header, _sig("BOOL"), b"")


@pytest.mark.parametrize("raw, where, shown", [
    (b'[1.0, NaN, 2.0]', [0, 1], "NaN"),
    (b'[1.0, 2.0, Infinity]', [0, 2], "Infinity"),
    (b'[-Infinity, 2.0, 3.0]', [0, 0], "-Infinity"),
    (b'[1.0, 2.0, 1e400]', [0, 2], "Infinity"),
    (b'[1.0, 1e39, 2.0]', [0, 1], "Infinity"),  # beyond FP32's range
])
def test_non_finite_json_inputs_are_refused_naming_tensor_and_position(raw, where, shown):
    body = json.loads(b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", '
                      b'"data": ' + raw + b"}]}")
    with pytest.raises(BadRequest) as info:
        decode_infer(body, _sig("FP32"))
    message = str(info.value)
    assert "input 'x'" in message and f"{shown}" in message and f"position {where}" in message
    assert "allow_non_finite" in message
    with pytest.raises(BadRequest, match=r"input 'x'.*position \[0, 1\]"):
        decode_simple({"inputs": [[1.0, float("nan"), 0.0]]}, _sig("FP32"))
    arrays, _ = decode_infer(body, _sig("FP32", allow=True))
    assert not np.isfinite(arrays["x"]).all()


def test_non_finite_binary_inputs_are_refused_too():
    routes = Routes("m", INFO, _sig("FP32"), _echo)
    x = np.array([[0.0, 1.0, np.inf]], dtype=np.float32)
    status, (content, _) = _answer(routes, *_triton_request(x, "FP32"))
    assert status == 400 and "position [0, 2]" in json.loads(content)["error"]
    allowed = Routes("m", INFO, _sig("FP32", allow=True), _echo)
    status, (content, headers) = _answer(allowed, *_triton_request(x, "FP32"))
    assert status == 200
    np.testing.assert_array_equal(_triton_result(content, headers).as_numpy("y"), x)


def test_non_finite_outputs_never_leave_as_bare_json():
    with pytest.raises(BadRequest, match=r"output 'y'.*NaN at position \[1\].*binary"):
        encode_infer_outputs({"y": np.array([0.0, np.nan])})
    tensors, tail = encode_infer_outputs({"y": np.array([0.0, np.nan])}, binary={"y"})
    assert tensors[0]["parameters"] == {"binary_data_size": 16} and len(tail) == 16

    async def nan(arrays):
        return {"y": np.full(arrays["x"].shape, np.nan, dtype=np.float32)}

    routes = Routes("m", INFO, _sig("FP32"), nan)
    status, (content, _) = _answer(routes, json.dumps({"inputs": [[1, 2, 3]]}).encode(), {},
                                   path="/")
    assert status == 400 and "output 'y'" in json.loads(content)["error"]
    with pytest.raises(ValueError):
        render({"x": float("nan")})  # the last guard: never a bare NaN on the wire


def test_bytes_tensors_in_json_and_binary_both_ways_with_tritonclient():
    sig = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
           "outputs": [{"name": "upper", "datatype": "BYTES", "shape": [-1]}]}

    async def upper(arrays):
        return {"upper": np.array([t.upper() for t in arrays["text"]], dtype=object)}

    routes = Routes("m", INFO, sig, upper)
    assert routes.metadata()["inputs"][0]["datatype"] == "BYTES"
    texts = np.array(["caf\u00e9 au lait".encode(), b"", b"a b"], dtype=object)
    for binary in (True, False):
        tensor = triton.InferInput("text", [3], "BYTES")
        tensor.set_data_from_numpy(texts, binary_data=binary)
        out = [triton.InferRequestedOutput("upper", binary_data=binary)]
        body, size = triton.InferenceServerClient.generate_request_body([tensor], outputs=out)
        headers = {} if size is None else {"inference-header-content-length": str(size)}
        status, (content, answer_headers) = _answer(routes, body, headers)
        assert status == 200, content
        result = _triton_result(content, answer_headers)
        assert result.get_output("upper")["datatype"] == "BYTES"
        want = [t.upper() for t in texts]
        # tritonclient gives bytes for binary outputs and the JSON strings as they came.
        got = [g if binary else g.encode() for g in result.as_numpy("upper")]
        assert got == want
    # The simple form: a list of strings in, strings out.
    status, (content, _) = _answer(routes, json.dumps({"inputs": ["ab", "c\u00e9"]}).encode(),
                                   {}, path="/")
    # bytes.upper() changes ASCII letters only.
    assert status == 200 and json.loads(content)["predictions"] == ["AB", "C\u00e9"]


@pytest.mark.parametrize("tensor, fragment", [
    ({"data": [1, 2]}, "takes strings"),
    ({"data": [["a"], ["b", "c"]], "shape": [2]}, "ragged"),
    ({"data": ["a", "b"], "shape": [3]}, "needs 3 values"),
    ({"data": {"a": 1}}, "list of strings"),
])
def test_malformed_bytes_json_is_400_naming_the_tensor(tensor, fragment):
    sig = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
           "outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1]}]}
    entry = {"name": "text", "datatype": "BYTES", "shape": [2], **tensor}
    with pytest.raises(BadRequest, match=fragment) as info:
        decode_infer({"inputs": [entry]}, sig)
    assert "'text'" in str(info.value)


@pytest.mark.parametrize("raw, fragment", [
    (b"\x05\x00\x00\x00ab", "says 5 bytes"),
    (b"\x01\x00\x00\x00a", "ends after 1 of 2"),
    (b"\x01\x00\x00\x00a\x01\x00\x00\x00b\x00", "1 bytes follow"),
])
def test_malformed_binary_bytes_are_400_with_the_reason(raw, fragment):
    sig = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
           "outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1]}]}
    header = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(raw)}}]}
    with pytest.raises(BadRequest, match=fragment):
        decode_infer(header, sig, raw)


def test_bytes_outputs_that_are_not_utf8_must_be_asked_for_in_binary():
    raw = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(BadRequest, match=r"output 'y' element 0 is not UTF-8.*binary"):
        encode_infer_outputs({"y": raw})
    tensors, tail = encode_infer_outputs({"y": raw}, binary={"y"})
    assert tensors[0]["datatype"] == "BYTES" and tail == b"\x02\x00\x00\x00\xff\xfe"
