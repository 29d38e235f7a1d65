"""Fabric as a task body: the practice's loop, written with ``L.Fabric``, on Ray's world.

The loop is Fabric's as ``lightning-in-depth`` writes it (``fabric.launch()``,
``fabric.setup``, ``fabric.setup_dataloaders``, ``fabric.backward``, ``fabric.save``), on two
CPU workers. The ranks and the process group are Ray Train's; a second run with the same
storage and name loads the first one's checkpoint and goes on from its step.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from _models import SAME_IMPORTS_ENV, regression_rows, ship_by_value
from ray.train import RunConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import FabricTrainer, ray_fabric_kwargs

L = pytest.importorskip("lightning")

ship_by_value(__name__)

pytestmark = [pytest.mark.lightning_packages, pytest.mark.usefixtures("ray_cluster")]
RAY_NUM_CPUS = 3
RAY_ENV_VARS = SAME_IMPORTS_ENV


def fabric_loop(config):
    fabric = L.Fabric(**ray_fabric_kwargs(), precision="32-true")
    fabric.launch()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    rows = [(torch.from_numpy(r["x"]), torch.tensor(r["y"])) for r in regression_rows(64)]
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(rows, batch_size=8))

    path = os.path.join(config["checkpoint_dir"], "last.ckpt")
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if os.path.exists(path):
        fabric.load(path, state)
    loaded = next(model.parameters()).detach().flatten()[:4].tolist()
    start, seen = state["step"], []
    for epoch in range(100):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            if state["step"] == start + config["steps"]:
                break
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            state["step"] += 1
            seen.append(float(loss))
        else:
            continue
        break
    fabric.save(path, state)
    weight = next(model.parameters()).detach().flatten()[:4].tolist()
    with open(os.path.join(config["record_dir"], f"rank{fabric.global_rank}.json"), "w") as f:
        json.dump({"world_size": fabric.world_size, "rank": fabric.global_rank,
                   "start": start, "step": state["step"], "losses": seen,
                   "weight": weight, "loaded": loaded, "batches": len(loader)}, f)


def run(tmp_path, steps, attempt):
    records = tmp_path / f"records-{attempt}"
    records.mkdir()
    trainer = FabricTrainer(
        fabric_loop, train_loop_config={"steps": steps, "record_dir": str(records)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="fabric", storage_path=str(tmp_path / "ray")))
    trainer.fit()
    return trainer, [json.loads((records / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_a_fabric_loop_trains_on_rays_world_and_resumes(tmp_path):
    trainer, first = run(tmp_path, steps=3, attempt=1)
    assert trainer.checkpoint_dir == f"{tmp_path}/ray/fabric/fabric"
    for rank, record in enumerate(first):
        assert (record["rank"], record["world_size"]) == (rank, 2)
        assert record["batches"] == 4  # 64 rows / 2 ranks / batch 8: the sampler split them
        assert (record["start"], record["step"]) == (0, 3)
    # DDP kept the replicas equal: the gradients were averaged over Ray's process group.
    assert first[0]["weight"] == first[1]["weight"]
    assert os.path.exists(os.path.join(trainer.checkpoint_dir, "last.ckpt"))

    _, second = run(tmp_path, steps=3, attempt=2)
    for record in second:
        assert (record["start"], record["step"]) == (3, 6)  # fabric.load restored the step
    assert second[0]["weight"] == second[1]["weight"]
    # The rerun starts from the weights the first run saved, on every rank.
    assert [r["loaded"] for r in second] == [r["weight"] for r in first]


def test_ray_fabric_kwargs_outside_a_worker_says_where_it_belongs():
    with pytest.raises(ValueError, match=r"inside a Ray Train worker's loop.*Fix: build the "
                                         r"Fabric in the loop function"):
        ray_fabric_kwargs()
