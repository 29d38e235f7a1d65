"""ModelRegistry on real storage: a local folder and ``memory://``, same tests for both."""

from __future__ import annotations

import json
import uuid

import pytest
import registry_factories as rf
import torch

from michelangelo.lib.model_registry import (
    ModelRegistry,
    ModelRegistryError,
    Revision,
    RevisionNotFoundError,
    WeightsIntegrityError,
    parse_model_spec,
    registry_url,
)
from michelangelo.lib.trainer.torch.pytorch_lightning import ModelSpec


@pytest.fixture(params=["local", "memory"])
def registry(request, tmp_path):
    if request.param == "local":
        return ModelRegistry(str(tmp_path / "registry"))
    return ModelRegistry(f"memory://registry-{uuid.uuid4().hex[:8]}")


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return rf.create_mlp()


def test_default_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.delenv("MA_MODEL_REGISTRY_URL", raising=False)
    monkeypatch.setenv("UF_STORAGE_URL", "memory://uf")
    assert registry_url() == "memory://uf/model_registry"
    monkeypatch.setenv("MA_MODEL_REGISTRY_URL", str(tmp_path / "r"))
    assert ModelRegistry().url == str(tmp_path / "r")


def test_register_get_load_round_trip(registry):
    model = _mlp()
    spec = registry.register("proj", "mlp", model=model, create_model_fn=rf.create_mlp,
                             create_model_fn_kwargs={"features": 8, "hidden": 4},
                             metrics={"val_loss": torch.tensor(0.25), "epochs": 3},
                             description="first", tags={"team": "ml"})
    assert spec == ModelSpec("proj", "mlp", 1)
    revision = registry.get("proj/mlp")
    assert isinstance(revision, Revision) and revision.spec == spec
    assert revision.metrics == {"val_loss": 0.25, "epochs": 3}
    assert revision.factory == {"module": "registry_factories", "qualname": "create_mlp",
                                "script_path": None, "kwargs": {"features": 8, "hidden": 4}}
    assert {"torch", "pytorch-lightning", "ray", "python"} <= set(revision.versions)
    assert len(revision.weights_sha256) == 64 and revision.num_tensors == 4
    json.dumps(revision.to_dict())  # JSON-serialisable
    assert Revision.from_dict(revision.to_dict()) == revision
    loaded = registry.load_state_dict(spec)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded[key], value)
    rebuilt = registry.load_model("proj/mlp:1")
    assert not rebuilt.training
    x = torch.randn(3, 8)
    assert torch.equal(rebuilt(x), model(x))


def test_revisions_count_up_and_latest_is_newest(registry):
    specs = [registry.register("p", "m", state_dict=_mlp(i).state_dict()) for i in range(3)]
    assert [s.revision_id for s in specs] == [1, 2, 3]
    assert registry.get("p/m").revision_id == 3
    assert registry.get(ModelSpec("p", "m")).revision_id == 3
    registry.register("p", "other", state_dict=_mlp().state_dict())
    assert [r.name for r in registry.list("p")] == ["p/m:1", "p/m:2", "p/m:3", "p/other:1"]
    assert [r.revision_id for r in registry.list("p", "m")] == [1, 2, 3]
    registry.delete("p/m:2")
    assert [r.revision_id for r in registry.list("p", "m")] == [1, 3]
    with pytest.raises(RevisionNotFoundError, match=r"no revision 2 \(revisions: \[1, 3\]\)"):
        registry.get("p/m:2")
    # A deleted number is never handed out again.
    assert registry.register("p", "m", state_dict=_mlp().state_dict()).revision_id == 4


def test_aliases_resolve_everywhere_and_keep_history(registry):
    for i in range(3):
        registry.register("p", "m", state_dict=_mlp(i).state_dict())
    registry.set_alias("p", "m", "champion", 1)
    registry.set_alias("p", "m", "champion", 3)
    registry.set_alias("p", "m", "@challenger", "2")
    assert registry.get("p/m@champion").revision_id == 3
    assert registry.get(ModelSpec("p", "m", "@champion")).revision_id == 3
    assert registry.get(ModelSpec("p", "m", "challenger")).revision_id == 2
    assert registry.get("p/m:3").aliases == ["champion"]
    assert torch.equal(registry.load_state_dict("p/m@challenger")["0.weight"],
                       _mlp(1).state_dict()["0.weight"])
    with pytest.raises(ModelRegistryError, match="still the target of alias"):
        registry.delete("p/m:3")
    registry.remove_alias("p", "m", "challenger")
    history = registry.alias_history("p", "m")
    assert [(h["alias"], h["from"], h["to"]) for h in history] == [
        ("champion", None, 1), ("champion", 1, 3), ("challenger", None, 2),
        ("challenger", 2, None)]
    assert all(h["when"] > 0 for h in history)
    with pytest.raises(RevisionNotFoundError, match="no alias 'challenger'"):
        registry.get("p/m@challenger")
    with pytest.raises(RevisionNotFoundError, match="no revision 9"):
        registry.set_alias("p", "m", "champion", 9)
    with pytest.raises(ValueError, match="'latest' is reserved"):
        registry.set_alias("p", "m", "latest", 1)


def test_tied_weights_stay_tied(registry):
    torch.manual_seed(0)
    model = rf.create_tied()
    spec = registry.register("p", "tied", model=model, create_model_fn=rf.create_tied)
    assert registry.get(spec).num_tensors == 2
    loaded = registry.load_state_dict(spec)
    assert loaded["head.weight"] is loaded["embed.weight"]
    rebuilt = registry.load_model(spec)
    assert rebuilt.head.weight is rebuilt.embed.weight  # the factory ties; weights fit it
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.equal(rebuilt(tokens), model.eval()(tokens))
    # Views that only partly overlap are stored as copies with the right values.
    base = torch.arange(12.0)
    registry.register("p", "views", state_dict={"all": base, "half": base[:6],
                                                "strided": base[::2]})
    views = registry.load_state_dict("p/views")
    assert torch.equal(views["half"], base[:6]) and torch.equal(views["strided"], base[::2])


def test_corrupted_weights_are_an_error_naming_the_revision(registry):
    spec = registry.register("p", "m", state_dict=_mlp().state_dict())
    store = registry._store
    path = store.file("p", "m", 1, "weights.safetensors")
    data = bytearray(store.storage.read_bytes(path))
    data[-1] ^= 0xFF  # flip bits in the last tensor's data
    store.storage.write_bytes(path, bytes(data))
    with pytest.raises(WeightsIntegrityError, match=r"p/m:1: weights.safetensors is corrupted"):
        registry.load_state_dict(spec)
    store.storage.write_bytes(path, b"garbage")
    with pytest.raises(WeightsIntegrityError, match="p/m:1"):
        registry.load_state_dict(spec)


def test_input_example_outputs_and_signature(registry):
    model = _mlp()
    x = torch.randn(2, 8)
    spec = registry.register("p", "m", model=model, create_model_fn=rf.create_mlp,
                             input_example=x)
    revision = registry.get(spec)
    assert revision.signature == {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}]}
    example = revision.input_example
    assert example["inputs"]["input"]["shape"] == [2, 8]
    torch.testing.assert_close(torch.tensor(example["outputs"]["output"]["data"]),
                               model(x).detach())
    # Dict examples: one named input per key, model(**inputs); built by the factory.
    import numpy as np

    two = rf.TwoInputs()
    spec = registry.register("p", "two", model=two, create_model_fn=rf.TwoInputs,
                             input_example={"a": np.ones((1, 3), np.float32),
                                            "b": torch.zeros(1, 3)})
    signature = registry.get(spec).signature
    assert [i["name"] for i in signature["inputs"]] == ["a", "b"]
    assert {o["name"]: o["datatype"] for o in signature["outputs"]} == {"sum": "FP32",
                                                                        "ids": "INT64"}
    # Built from the factory when only weights are given.
    spec = registry.register("p", "m", state_dict=model.state_dict(),
                             create_model_fn=rf.create_mlp, input_example=x)
    assert registry.get(spec).input_example["outputs"] == example["outputs"]
    with pytest.raises(ValueError, match="the model failed on input_example"):
        registry.register("p", "m", model=model, input_example=torch.randn(2, 5))
    with pytest.raises(ValueError, match="needs a model to run it"):
        registry.register("p", "m", state_dict=model.state_dict(), input_example=x)


def test_bad_arguments_fail_before_writing(registry):
    sd = _mlp().state_dict()
    with pytest.raises(ValueError, match="exactly one weights source"):
        registry.register("p", "m", state_dict=sd, model=_mlp())
    with pytest.raises(ValueError, match="exactly one weights source"):
        registry.register("p", "m")
    with pytest.raises(ValueError, match=r"project_name='a/b' is not a valid name"):
        registry.register("a/b", "m", state_dict=sd)
    with pytest.raises(ValueError, match=r"state_dict\['step'\] is a int"):
        registry.register("p", "m", state_dict={**sd, "step": 3})
    with pytest.raises(ValueError, match="lambda"):
        registry.register("p", "m", state_dict=sd, create_model_fn=lambda: rf.create_mlp())
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        registry.register("p", "m", state_dict=sd, create_model_fn=rf.create_mlp,
                          create_model_fn_kwargs={"features": object()})
    with pytest.raises(ValueError, match="shares no parameter name"):
        registry.register("p", "m", state_dict={"w": torch.zeros(2)},
                          create_model_fn=rf.create_mlp)
    with pytest.raises(ValueError, match="keep_optimizer_state=True needs checkpoint_path"):
        registry.register("p", "m", state_dict=sd, keep_optimizer_state=True)
    with pytest.raises(ValueError, match=r"metrics\['loss'\]"):
        registry.register("p", "m", state_dict=sd, metrics={"loss": [1, 2]})
    assert registry.list("p") == []
    with pytest.raises(RevisionNotFoundError, match="has no revisions"):
        registry.get("p/m")


def test_load_model_without_factory_says_how(registry):
    spec = registry.register("p", "m", state_dict=_mlp().state_dict())
    with pytest.raises(ValueError, match="no recorded factory"):
        registry.load_model(spec)
    model = registry.load_model(spec, create_model_fn=rf.create_mlp)
    assert not model.training
    with pytest.raises(ValueError, match="do not fit the model"):
        registry.load_model(spec, create_model_fn=rf.create_tied)


def test_parse_model_spec_forms():
    assert parse_model_spec("p/m") == ModelSpec("p", "m", None)
    assert parse_model_spec("p/m:3") == ModelSpec("p", "m", 3)
    assert parse_model_spec("p/m@champion") == ModelSpec("p", "m", "@champion")
    assert parse_model_spec(ModelSpec("p", "m", "champion")).revision_id == "@champion"
    assert parse_model_spec(ModelSpec("p", "m", "7")).revision_id == 7
    for bad in ("p", "p/m:x", "p/m:0", "p/m/x", "p/m@", ""):
        with pytest.raises(ValueError, match="model spec|revision|not a valid"):
            parse_model_spec(bad)


def test_weights_file_is_plain_safetensors_both_ways(tmp_path):
    from safetensors.torch import load_file, save_file

    from michelangelo.lib.model_registry import _safetensors as st

    mixed = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64),
             "c": torch.randn(4, dtype=torch.float64).to(torch.bfloat16),
             "d": torch.tensor([True, False, True]), "e": torch.zeros(0, 3),
             "f": torch.tensor(2.5), "g": torch.randn(5, 3).t()}
    registry = ModelRegistry(str(tmp_path / "r"))
    spec = registry.register("p", "mixed", state_dict=mixed)
    path = registry._store.file("p", "mixed", spec.revision_id, "weights.safetensors")
    theirs = load_file(path)  # the safetensors library reads our file
    ours = registry.load_state_dict(spec)
    for key, value in mixed.items():
        assert torch.equal(theirs[key], value) and torch.equal(ours[key], value), key
        assert ours[key].dtype == value.dtype and ours[key].shape == value.shape
    save_file({k: v.contiguous() for k, v in mixed.items()}, str(tmp_path / "lib.safetensors"))
    with open(tmp_path / "lib.safetensors", "rb") as handle:
        data = handle.read()
    with open(tmp_path / "lib.safetensors", "rb") as handle:
        back, digest = st.read_state_dict(handle, len(data))
    assert digest == st.sha256_of(data)
    for key, value in mixed.items():
        assert torch.equal(back[key], value), key


def test_a_revision_registered_in_a_task_is_in_the_run_record(tmp_path):
    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.core._console import Reporter
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    registry = ModelRegistry(str(tmp_path / "registry"))

    @uniflow.task()
    def register() -> str:
        spec = registry.register("p", "m", model=_mlp(), create_model_fn=rf.create_mlp,
                                 metrics={"val_loss": 0.5})
        return str(spec)

    storage = str(tmp_path / "uf")
    context = uniflow.Context(storage_url=storage, reporter=Reporter())
    context.run(register)
    tasks = RunStore(Storage(storage)).load_tasks(context.last_run_id)
    entries = [a for t in tasks for a in t.artifacts if a["kind"] == "registry_revision"]
    assert len(entries) == 1
    assert entries[0]["spec"] == "p/m:1" and entries[0]["metrics"] == {"val_loss": 0.5}
    assert entries[0]["weights_bytes"] > 0


def test_loaded_weights_are_private_copies_of_the_mapped_file(tmp_path):
    import gc

    registry = ModelRegistry(str(tmp_path / "registry"))
    model = _mlp()
    spec = registry.register("p", "m", model=model, create_model_fn=rf.create_mlp)
    first = registry.load_state_dict(spec)
    del registry
    gc.collect()
    for tensor in first.values():
        tensor.add_(1.0)  # copy-on-write: only this process's pages change
    again = ModelRegistry(str(tmp_path / "registry")).load_state_dict(spec)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(again[name], tensor)
        torch.testing.assert_close(first[name], tensor + 1.0)
