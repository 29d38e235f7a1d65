"""Loading a revision for serving: weights, sha256, example replay; batch splitting (no Ray)."""

import glob
import os

import numpy as np
import pytest
import serving_models

from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.serving import DeploymentDescription, ReadinessError
from michelangelo.lib.serving._model import ServedModel


@pytest.fixture
def registry(tmp_path):
    return ModelRegistry(str(tmp_path / "registry"))


def test_load_replays_the_example_and_serves_rows(registry):
    spec = serving_models.register_row_linear(registry)
    served = ServedModel.load(registry.url, spec)
    assert served.info["revision_id"] == 1
    assert served.info["weights_sha256"] == registry.get(spec).weights_sha256
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = served.forward({"input": x})
    assert out["y"].shape == (2, 1) and out["batch_rows"].tolist() == [[2], [2]]


def test_named_inputs_are_passed_as_keywords(registry):
    spec = serving_models.register_mixed(registry)
    served = ServedModel.load(registry.url, spec)
    out = served.forward({"x": np.ones((2, 3), np.float32), "k": np.array([[1], [2]]),
                          "flag": np.array([[True], [False]])})
    assert out["output"].tolist() == [[4.0], [-1.0]]


def test_forward_many_is_one_pass_and_gives_each_request_its_rows(registry):
    served = ServedModel.load(registry.url, serving_models.register_row_linear(registry))
    requests = [{"input": np.full((n, 4), float(n), np.float32)} for n in (1, 3, 2)]
    results = served.forward_many(requests)
    alone = [served.forward(r)["y"] for r in requests]
    for request, result, single in zip(requests, results, alone, strict=True):
        rows = len(request["input"])
        assert result["y"].shape == (rows, 1)
        np.testing.assert_allclose(result["y"], single, rtol=1e-6)
        assert result["batch_rows"].ravel().tolist() == [6] * rows  # one pass of 6 rows


def test_example_that_does_not_reproduce_is_refused(registry):
    spec = serving_models.register_drifting(registry)
    with pytest.raises(ReadinessError, match="differs from the one recorded at registration"):
        ServedModel.load(registry.url, spec)


def test_tampered_weights_are_refused(registry):
    spec = serving_models.register_row_linear(registry)
    (path,) = glob.glob(os.path.join(registry.url, "**", "weights.safetensors"), recursive=True)
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    data[-1] ^= 0xFF
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    with pytest.raises(ReadinessError, match="loading the weights failed.*sha256"):
        ServedModel.load(registry.url, spec)


def test_description_validates_and_renders_a_serve_config():
    d = DeploymentDescription(name="churn-1", project_name="p", model_name="m", revision_id=2,
                              weights_sha256="ab", registry_url="/r", num_replicas=2)
    config = d.to_serve_config()
    app = config["applications"][0]
    assert app["route_prefix"] == "/churn-1"
    assert app["import_path"] == "michelangelo.lib.serving._app:build_app"
    assert DeploymentDescription.from_dict(app["args"]["description"]) == d
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8000}
    for field, value, fragment in [("name", "Bad/Name", "name='Bad/Name'"),
                                   ("num_replicas", 0, "num_replicas=0"),
                                   ("max_batch_size", 0, "max_batch_size=0"),
                                   ("batch_wait_timeout_s", -1, "batch_wait_timeout_s=-1"),
                                   ("port", 70000, "port=70000")]:
        kwargs = {**d.to_dict(), field: value}
        with pytest.raises(ValueError, match=fragment.replace("/", "/")):
            DeploymentDescription(**kwargs)


def test_a_signature_may_allow_non_finite_inputs(registry):
    import torch

    from michelangelo.lib.serving._errors import BadRequest
    from michelangelo.lib.serving._oip import decode_simple

    example = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
    spec = registry.register("serving", "nansafe", model=serving_models.create_nan_safe(),
                             create_model_fn=serving_models.create_nan_safe,
                             input_example=example, allow_non_finite=["input"])
    served = ServedModel.load(registry.url, spec)  # the replay compares NaN with NaN
    assert served.signature["inputs"][0]["allow_non_finite"] is True
    rows = decode_simple({"inputs": [[float("nan"), 1.0]]}, served.signature)
    assert served.forward(rows)["output"].tolist() == [[1.0]]
    plain = registry.register("serving", "nansafe", model=serving_models.create_nan_safe(),
                              create_model_fn=serving_models.create_nan_safe,
                              input_example=torch.ones(1, 2))
    with pytest.raises(BadRequest, match=r"input 'input'.*NaN at position \[0, 0\]"):
        decode_simple({"inputs": [[float("nan"), 1.0]]}, registry.get(plain).signature)
    for allow, fragment in [(["nope"], r"inputs are \[.input.\]"), ("input", "list of input")]:
        with pytest.raises(ValueError, match=fragment):
            registry.register("serving", "nansafe", model=serving_models.create_nan_safe(),
                              input_example=torch.ones(1, 2), allow_non_finite=allow)
    with pytest.raises(ValueError, match="needs input_example"):
        registry.register("serving", "nansafe", model=serving_models.create_nan_safe(),
                          allow_non_finite=True)
