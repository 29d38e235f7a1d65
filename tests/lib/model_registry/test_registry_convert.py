"""Registering from trainer checkpoints (every format, through the trainer's own loaders),
optimizer state kept without pickles, and factories defined in ``__main__`` scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import fsspec
import pytest
import pytorch_lightning as pl
import registry_factories as rf
import torch
from torch.utils.data import DataLoader, TensorDataset

from michelangelo.lib.checkpoints import CHECKPOINT_NAME
from michelangelo.lib.model_registry import ModelRegistry


@pytest.fixture(scope="module")
def ddp_checkpoint(tmp_path_factory):
    """A Ray-layout folder with a single-file Lightning checkpoint after 2 epochs."""
    torch.manual_seed(0)
    model = rf.create_lightning()
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=8))
    folder = tmp_path_factory.mktemp("ckpt") / "checkpoint_000001"
    folder.mkdir()
    trainer.save_checkpoint(folder / CHECKPOINT_NAME)
    optimizer = trainer.optimizers[0].state_dict()
    return folder, {k: v.clone() for k, v in model.state_dict().items()}, optimizer


def test_full_checkpoint_with_optimizer_state(ddp_checkpoint, tmp_path):
    folder, weights, optimizer = ddp_checkpoint
    registry = ModelRegistry(str(tmp_path / "r"))
    spec = registry.register("p", "m", checkpoint_path=str(folder), keep_optimizer_state=True,
                             create_model_fn=rf.create_lightning)
    revision = registry.get(spec)
    assert revision.lineage["checkpoint"] == str(folder)
    assert revision.lineage["checkpoint_format"].startswith("single file")
    assert revision.optimizer_state["epoch"] == 2
    assert revision.optimizer_state["global_step"] == 8
    loaded = registry.load_state_dict(spec)
    assert sorted(loaded) == sorted(weights)
    for key, value in weights.items():
        assert torch.equal(loaded[key], value)
    state = registry.load_training_state(spec)
    (restored,) = state.optimizer_states
    assert restored["param_groups"][0]["lr"] == optimizer["param_groups"][0]["lr"]
    assert list(restored["param_groups"][0]["betas"]) == list(optimizer["param_groups"][0]["betas"])
    assert sorted(restored["state"]) == sorted(optimizer["state"])
    for pid, entries in optimizer["state"].items():
        for name, value in entries.items():
            assert torch.equal(restored["state"][pid][name], value)
    # A fresh Adam accepts the restored state as it is.
    torch.optim.Adam(rf.create_lightning().parameters()).load_state_dict(restored)
    model = registry.load_model(spec)
    assert torch.equal(model.net[0].weight, weights["net.0.weight"])
    stored = os.listdir(registry._store.revision_dir("p", "m", 1))
    assert sorted(stored) == ["optimizer.json", "optimizer.safetensors", "revision.json",
                              "weights.safetensors"]  # no pickle anywhere


def test_checkpoint_from_memory_url_and_train_result(ddp_checkpoint, tmp_path):
    folder, weights, _ = ddp_checkpoint
    fs = fsspec.filesystem("memory")
    fs.put(str(folder), "/ckpts/run1/checkpoint_000001", recursive=True)
    registry = ModelRegistry("memory://reg-convert")
    result = {"checkpoint_path": "memory://ckpts/run1/checkpoint_000001",
              "path": "memory://ckpts/run1", "metrics": {"train_loss": 0.5, "epoch": 1}}
    spec = registry.register("p", "m", train_result=result, create_model_fn=rf.create_lightning,
                             datasets={"train": "abc123"}, lineage={"git": "deadbeef"})
    revision = registry.get(spec)
    assert revision.metrics == {"train_loss": 0.5, "epoch": 1}
    assert revision.lineage["training_run"] == "memory://ckpts/run1"
    assert revision.lineage["checkpoint"] == result["checkpoint_path"]
    assert revision.lineage["datasets"] == [{"name": "train", "fingerprint": "abc123"}]
    assert revision.lineage["git"] == "deadbeef"
    assert torch.equal(registry.load_state_dict(spec)["net.2.bias"], weights["net.2.bias"])


@pytest.mark.parametrize("entry", ["state_dict", "model"])
def test_sharded_dcp_folders_fsdp2_and_fsdp1(tmp_path, entry):
    """The on-disk layouts FSDP2 (``state_dict``) and FSDP1 sharded (``model``) write."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(3)
    reference = rf.create_lightning().state_dict()
    target = tmp_path / "checkpoint_000000" / CHECKPOINT_NAME
    dcp.save({entry: reference, "optimizer_0": {"step": torch.tensor(1)}}, checkpoint_id=target,
             no_dist=True)
    registry = ModelRegistry(str(tmp_path / "r"))
    spec = registry.register("p", "m", checkpoint_path=str(target.parent))
    loaded = registry.load_state_dict(spec)
    assert sorted(loaded) == sorted(reference)
    for key, value in reference.items():
        assert torch.equal(loaded[key], value)
    assert "FSDP" in registry.get(spec).lineage["checkpoint_format"]
    with pytest.raises(ValueError, match="keep_optimizer_state=True needs a single-file"):
        registry.register("p", "m", checkpoint_path=str(target.parent), keep_optimizer_state=True)


def test_factory_in_a_main_script_is_imported_again_by_path(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from michelangelo.lib.model_registry import ModelRegistry

        def create_model(width=3):
            return torch.nn.Linear(2, width)

        if __name__ == "__main__":
            torch.manual_seed(0)
            model = create_model(width=3)
            spec = ModelRegistry(sys.argv[1]).register(
                "p", "script", model=model, create_model_fn=create_model,
                create_model_fn_kwargs={"width": 3})
            print(spec.revision_id)
    """))
    root = str(tmp_path / "r")
    done = subprocess.run([sys.executable, str(script), root], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    registry = ModelRegistry(root)
    revision = registry.get("p/script")
    assert revision.factory["module"] == "__main__"
    assert revision.factory["script_path"] == str(script)
    model = registry.load_model("p/script")
    assert model.weight.shape == (3, 2)
    torch.manual_seed(0)
    assert torch.equal(model.weight, torch.nn.Linear(2, 3).weight)


def test_a_script_factory_is_found_in_another_copy_of_the_project(tmp_path, monkeypatch):
    # A remote job registers from its working_dir, which is gone when a new cluster (a
    # RayService) serves the revision from its own copy of the project.
    project = tmp_path / "job-working-dir"
    (project / "pkg").mkdir(parents=True)
    script = project / "pkg" / "factory_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from michelangelo.lib.model_registry import ModelRegistry

        def create_model():
            return torch.nn.Linear(2, 5)

        if __name__ == "__main__":
            ModelRegistry(sys.argv[1]).register("p", "moved", model=create_model(),
                                                create_model_fn=create_model)
    """))
    root = str(tmp_path / "r")
    done = subprocess.run([sys.executable, "pkg/factory_script.py", root], capture_output=True,
                          text=True, timeout=300, cwd=str(project))
    assert done.returncode == 0, done.stderr
    registry = ModelRegistry(root)
    assert registry.get("p/moved").factory["script_relpath"] == "pkg/factory_script.py"
    copy = tmp_path / "service-copy"
    project.rename(copy)
    with pytest.raises(ValueError, match="no longer exists"):
        registry.load_model("p/moved")  # run from elsewhere, the old path is all there is
    monkeypatch.chdir(copy)
    assert registry.load_model("p/moved").weight.shape == (5, 2)


def test_closures_and_nested_functions_are_refused_with_the_fix(tmp_path):
    registry = ModelRegistry(str(tmp_path / "r"))
    width = 3

    def nested():
        return torch.nn.Linear(2, width)

    with pytest.raises(ValueError, match=r"closure or nested function.*Fix: define the factory"):
        registry.register("p", "m", model=nested(), create_model_fn=nested)
    assert registry.list("p") == []
