"""Quickstart: prepare data on a Ray cluster, train with LightningTrainer, register, deploy.

Run it with ``python examples/quickstart/workflow.py`` (or ``make demo``);
``michelangelo run examples/quickstart/workflow.py:sweep`` trains three learning rates
concurrently instead and serves the best. Everything runs
on a laptop: uniflow starts a local Ray cluster shaped like each RayTask and removes it when
the run ends, so the endpoint answers while the run lasts. Start a standing cluster first
(``michelangelo cluster up``) and the run borrows it instead: the endpoint then stays up
after the run, for the printed ``curl`` line to reach it.
"""

from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import ray
import ray.data
import torch
from ray.train import CheckpointConfig, ScalingConfig
from torch import nn

import michelangelo.uniflow.core as uniflow
from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.uniflow.core.lib import concurrent
from michelangelo.uniflow.plugins.ray import RayTask, create_run_config
from michelangelo.workflow.variables import DatasetVariable

FEATURES = 8
# The head holds more than the workers: on Kubernetes each node's memory is a hard limit, and
# the head runs the task's driver (torch and Lightning imported) and Ray Train's controller
# beside Ray's own processes; at 2Gi, Ray's memory monitor killed them mid-training.
CLUSTER = RayTask(head_cpu=1, head_memory="4Gi", worker_cpu=2, worker_memory="2Gi",
                  worker_instances=2)


class Regressor(pl.LightningModule):
    """A small MLP for a noisy linear target."""

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


def create_model(hidden_dim: int, learning_rate: float) -> pl.LightningModule:
    """Runs on every Ray Train worker."""
    return Regressor(hidden_dim=hidden_dim, learning_rate=learning_rate)


def _rows(batch: dict) -> dict:
    rng = np.random.default_rng(int(batch["id"][0]))
    x = rng.normal(size=(len(batch["id"]), FEATURES)).astype(np.float32)
    weights = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)
    y = (x @ weights + 0.05 * rng.normal(size=len(x))).astype(np.float32)
    return {"x": list(x), "y": y}


@uniflow.task(config=CLUSTER)
def prepare(n_rows: int) -> tuple[DatasetVariable, DatasetVariable]:
    data = ray.data.range(n_rows).map_batches(_rows, batch_size=500)
    train, val = data.train_test_split(test_size=0.2, seed=0)
    return DatasetVariable.create(train), DatasetVariable.create(val)


@uniflow.task(config=CLUSTER)
def train(train_dv: DatasetVariable, val_dv: DatasetVariable, epochs: int,
          learning_rate: float = 1e-2) -> dict:
    train_dv.load_ray_dataset()
    val_dv.load_ray_dataset()
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_model,
            create_model_fn_kwargs={"hidden_dim": 32, "learning_rate": learning_rate},
            train_data=train_dv.value,
            val_data=val_dv.value,
            batch_size=32,
            lightning_trainer_kwargs={"max_epochs": epochs, "log_every_n_steps": 10},
        ),
        run_config=create_run_config(
            checkpoint_config=CheckpointConfig(
                num_to_keep=1,
                checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min",
            ),
        ),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    )
    result = trainer.train()
    return {"checkpoint_path": result["checkpoint_path"], "path": result["path"],
            "learning_rate": learning_rate,
            "metrics": {k: float(v) for k, v in result["metrics"].items()
                        if isinstance(v, int | float)}}


@uniflow.task()
def register(trained: dict) -> str:
    """A new revision of quickstart/regressor; the factory and an input example go with it."""
    spec = ModelRegistry().register(
        "quickstart", "regressor", train_result=trained, create_model_fn=create_model,
        create_model_fn_kwargs={"hidden_dim": 32,
                                "learning_rate": trained.get("learning_rate", 1e-2)},
        input_example=torch.zeros(2, FEATURES))
    return f"{spec.project_name}/{spec.model_name}:{spec.revision_id}"


@uniflow.task(config=CLUSTER)
def deploy(spec: str, val_dv: DatasetVariable, port: int) -> dict:
    """Serve the revision over HTTP; check its answers against held-out rows."""
    from michelangelo.lib.serving import deploy as serve_revision
    from michelangelo.uniflow.plugins.ray import standing

    endpoint = serve_revision(spec, name="quickstart", port=port)
    frame = val_dv.load_pandas_dataframe().head(64)
    x = np.stack(frame["x"].to_list())
    y = frame["y"].to_numpy()
    predicted = np.asarray(endpoint.predict(x)).reshape(-1)
    row = np.round(x[:1].astype(np.float64), 3)  # short numbers for the curl line
    return {"spec": spec, "url": endpoint.url, "one_row": row.tolist(),
            "answer": endpoint.predict(row), "curl": endpoint.curl(row),
            "val_mse": float(((predicted - y) ** 2).mean()),
            "predict_mean_mse": float(((y - y.mean()) ** 2).mean()),
            "outlives_run": standing.find() is not None}


@uniflow.workflow()
def quickstart(n_rows: int = 4000, epochs: int = 3, port: int = 8000) -> dict:
    train_dv, val_dv = prepare(n_rows)
    trained = train(train_dv, val_dv, epochs)
    return deploy(register(trained), val_dv, port)


# --8<-- [start:sweep]
@uniflow.workflow()
def sweep(n_rows: int = 4000, epochs: int = 3, port: int = 8000) -> dict:
    """Train three learning rates at once on one cluster; register and serve the best."""
    train_dv, val_dv = prepare(n_rows)
    trained = concurrent.batch_run(
        [concurrent.new_callable(train, train_dv, val_dv, epochs, rate)
         for rate in (1e-3, 3e-3, 1e-2)],
    ).get()
    best = min(trained, key=lambda t: t["metrics"].get("val_loss", float("inf")))
    return deploy(register(best), val_dv, port)
# --8<-- [end:sweep]


if __name__ == "__main__":
    report = uniflow.create_context().run(quickstart)
    print(f"quickstart: deployed {report['spec']} at {report['url']}; over the held-out rows "
          f"its MSE is {report['val_mse']:.4f} (predicting the mean: "
          f"{report['predict_mean_mse']:.4f})")
    print(f"the endpoint answered {report['one_row']} with {report['answer']}")
    print(f"try it: {report['curl']}")
    if not report["outlives_run"]:
        print("(this endpoint ended with the run; run `michelangelo cluster up` first to keep it)")
    if not report["val_mse"] < report["predict_mean_mse"]:
        raise SystemExit("the model did not learn: val MSE is not below the mean predictor's")
