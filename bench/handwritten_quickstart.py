"""The quickstart written with Ray alone: what a user would write without the SDK.

Same job as ``examples/quickstart/workflow.py`` (same rows, model, batch size, epochs and
workers): Ray Data makes and splits the rows, a 2-worker ``TorchTrainer`` fits the
LightningModule with ``ray.train.lightning`` and keeps the best checkpoint by ``val_loss``,
Ray Serve serves the weights over HTTP, and the held-out rows are scored through it.
``bench/bench_quickstart.py`` runs this and the SDK's quickstart as fresh processes, in turn.

Prints one JSON line at the end: the wall time of each phase and the held-out MSE.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

FEATURES = 8


class Regressor(pl.LightningModule):
    """The quickstart's MLP, written out again as a user without the SDK would."""

    def __init__(self, hidden_dim: int, learning_rate: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(),
                                 nn.Linear(hidden_dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def _loss(self, batch) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch["x"].float()), batch["y"].float())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


def _rows(batch: dict) -> dict:
    rng = np.random.default_rng(int(batch["id"][0]))
    x = rng.normal(size=(len(batch["id"]), FEATURES)).astype(np.float32)
    weights = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)
    y = (x @ weights + 0.05 * rng.normal(size=len(x))).astype(np.float32)
    return {"x": list(x), "y": y}


def train_loop(config: dict) -> None:
    """Ray Train's documented Lightning recipe, run on every worker."""
    import ray.train
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    model = Regressor(hidden_dim=32, learning_rate=config["learning_rate"])
    train_batches = ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=32)
    val_batches = ray.train.get_dataset_shard("val").iter_torch_batches(batch_size=32)
    trainer = pl.Trainer(
        max_epochs=config["epochs"], log_every_n_steps=10, devices="auto",
        accelerator="auto", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()], enable_checkpointing=False,
        enable_progress_bar=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_batches, val_dataloaders=val_batches)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    import ray
    import ray.data
    from ray import serve
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marks = {"start": time.perf_counter()}
    ray.init()
    marks["ray_up"] = time.perf_counter()

    data = ray.data.range(args.rows).map_batches(_rows, batch_size=500)
    train_ds, val_ds = data.train_test_split(test_size=0.2, seed=0)
    marks["data"] = time.perf_counter()

    storage = tempfile.mkdtemp(prefix="handwritten-quickstart-")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"learning_rate": 1e-2, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=storage, checkpoint_config=CheckpointConfig(
            num_to_keep=1, checkpoint_score_attribute="val_loss",
            checkpoint_score_order="min")),
        datasets={"train": train_ds, "val": val_ds},
    )
    result = trainer.fit()
    with result.checkpoint.as_directory() as folder:
        state = torch.load(os.path.join(folder, "checkpoint.ckpt"), map_location="cpu",
                           weights_only=False)["state_dict"]
    marks["train"] = time.perf_counter()

    @serve.deployment
    class Predictor:
        def __init__(self, weights: dict) -> None:
            self.model = Regressor(hidden_dim=32, learning_rate=1e-2)
            self.model.load_state_dict(weights)
            self.model.eval()

        async def __call__(self, request) -> dict:
            rows = torch.tensor((await request.json())["rows"], dtype=torch.float32)
            with torch.no_grad():
                return {"predictions": self.model(rows).tolist()}

    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(Predictor.bind(state), name="quickstart", route_prefix="/quickstart")
    marks["serve_up"] = time.perf_counter()

    frame = val_ds.limit(64).to_pandas()
    x = np.stack(frame["x"].to_list())
    y = frame["y"].to_numpy()
    request = urllib.request.Request(
        f"http://127.0.0.1:{args.port}/quickstart",
        data=json.dumps({"rows": x.tolist()}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        predicted = np.asarray(json.load(answer)["predictions"])
    marks["request"] = time.perf_counter()
    serve.shutdown()
    ray.shutdown()
    marks["down"] = time.perf_counter()

    names = list(marks)
    phases = {name: round(marks[name] - marks[prev], 2)
              for prev, name in zip(names, names[1:], strict=False)}
    out = {"phases_s": phases, "val_mse": float(((predicted - y) ** 2).mean()),
           "predict_mean_mse": float(((y - y.mean()) ** 2).mean())}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
