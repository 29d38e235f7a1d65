"""The Open Inference Protocol codec against a recorded signature (no Ray)."""

import numpy as np
import pytest

from michelangelo.lib.serving._errors import BadRequest
from michelangelo.lib.serving._oip import decode_infer, decode_simple, encode_outputs

SIG = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]},
                  {"name": "k", "datatype": "INT64", "shape": [-1, 1]},
                  {"name": "flag", "datatype": "BOOL", "shape": [-1, 1]}],
       "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}]}
ONE = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}],
       "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}]}


def _tensors(**over):
    tensors = [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
               {"name": "k", "datatype": "INT64", "shape": [2, 1], "data": [[7], [8]]},
               {"name": "flag", "datatype": "BOOL", "shape": [2, 1], "data": [True, False]}]
    for t in tensors:
        t.update(over.get(t["name"], {}))
    return {"inputs": tensors}


def test_flat_and_nested_data_decode_to_typed_arrays():
    arrays, names = decode_infer(_tensors(), SIG)
    assert names is None
    assert arrays["x"].dtype == np.float32 and arrays["x"].shape == (2, 3)
    assert arrays["x"][1].tolist() == [4, 5, 6]
    assert arrays["k"].dtype == np.int64 and arrays["k"].tolist() == [[7], [8]]
    assert arrays["flag"].dtype == np.bool_


@pytest.mark.parametrize("over, fragment", [
    ({"x": {"name": "z"}}, "unknown input tensor 'z'"),
    ({"x": {"datatype": "FP64"}}, "does not match the registered 'FP32'"),
    ({"x": {"shape": [3, 2]}}, "dimension 1 is 2"),
    ({"x": {"shape": [2, 2]}}, "needs 4 values, but data has 6"),
    ({"x": {"shape": [6]}}, "rank 2"),
    ({"k": {"data": [1.5, 2.0]}}, "INT64 takes integers"),
    ({"flag": {"data": [1, 0]}}, "BOOL takes true/false"),
    ({"x": {"data": [[1, 2, 3], [4, 5]]}}, "ragged"),
    ({"x": {"data": ["a", "b", "c", "d", "e", "f"]}}, "strings"),
    ({"k": {"shape": [1, 1], "data": [1]}}, "same number of rows"),
])
def test_bad_tensors_name_the_tensor_and_the_fix(over, fragment):
    with pytest.raises(BadRequest, match="Fix|same number") as info:
        decode_infer(_tensors(**over), SIG)
    assert fragment in str(info.value)
    assert info.value.status == 400


def test_missing_and_duplicate_tensors_and_bad_bodies():
    body = _tensors()
    body["inputs"] = body["inputs"][:2]
    with pytest.raises(BadRequest, match=r"missing input tensor\(s\) \['flag'\]"):
        decode_infer(body, SIG)
    body = _tensors()
    body["inputs"].append(dict(body["inputs"][0]))
    with pytest.raises(BadRequest, match="given twice"):
        decode_infer(body, SIG)
    for bad in ([1, 2], {"inputs": []}, {"inputs": [5]}, {"inputs": [{"name": "x"}]}):
        with pytest.raises(BadRequest):
            decode_infer(bad, SIG)
    with pytest.raises(BadRequest, match="unknown output"):
        decode_infer({**_tensors(), "outputs": [{"name": "nope"}]}, SIG)


def test_integer_out_of_range_is_refused():
    sig = {"inputs": [{"name": "input", "datatype": "UINT8", "shape": [-1, 1]}], "outputs": []}
    with pytest.raises(BadRequest, match="out of range"):
        decode_infer({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1],
                                  "data": [300]}]}, sig)


def test_simple_form_single_and_named_inputs():
    arrays = decode_simple({"inputs": [[1, 2], [3, 4]]}, ONE)
    assert arrays["input"].dtype == np.float32 and arrays["input"].shape == (2, 2)
    named = decode_simple({"inputs": {"x": [[1, 2, 3]], "k": [[1]], "flag": [[True]]}}, SIG)
    assert named["k"].dtype == np.int64
    with pytest.raises(BadRequest, match="several inputs"):
        decode_simple({"inputs": [[1, 2, 3]]}, SIG)
    with pytest.raises(BadRequest, match="rank 2"):
        decode_simple({"inputs": [1, 2]}, ONE)
    with pytest.raises(BadRequest, match="empty"):
        decode_infer({"inputs": [{"name": "input", "datatype": "FP32", "shape": [0, 2],
                                  "data": []}]}, ONE)
    with pytest.raises(BadRequest, match="wrap your rows"):
        decode_simple([[1, 2]], ONE)


def test_outputs_carry_shape_and_datatype():
    out = encode_outputs({"y": np.arange(4, dtype=np.float64).reshape(2, 2),
                          "n": np.array([1, 2], dtype=np.int32)})
    assert out[0] == {"name": "y", "datatype": "FP64", "shape": [2, 2], "data": [0, 1, 2, 3]}
    assert out[1]["datatype"] == "INT32"
    assert [o["name"] for o in encode_outputs({"y": np.zeros(1), "n": np.zeros(1)}, ["n"])] == ["n"]
