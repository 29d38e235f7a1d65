"""Profiler sinks against a real MLflow file store and Comet's offline archives.

The multi-node test runs a real two-node Ray cluster (``ray.cluster_utils.Cluster``; the two
worker nodes get distinct loopback addresses so Ray Train gives them distinct node ranks) and a
hand-written ``TorchTrainer`` + Lightning DDP loop, and checks that the profile of the node
without global rank 0 reaches the tracker too.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import zipfile

import pytest
import pytorch_lightning as pl
import ray
import torch
from pytorch_lightning.loggers import CometLogger, CSVLogger, MLFlowLogger
from pytorch_lightning.profilers import SimpleProfiler
from torch.utils.data import DataLoader, TensorDataset

from michelangelo.lib.trainer.torch.pytorch_lightning._worker._profiler_sinks import (
    IDENTITY_ATTR,
    LoggerIdentity,
    comet_profiler_sink,
    mlflow_profiler_sink,
    share_logger_identity,
)

LOGGER = "michelangelo.lib.trainer.torch.pytorch_lightning._worker._profiler_sinks"
TRACKER_ENV = {
    # MLflow 3 refuses file stores without this; sqlalchemy (for sqlite:) is not installed here.
    "MLFLOW_ALLOW_FILE_STORE": "true",
    # CometLogger(online=False) builds a *disabled* experiment; this makes it write archives.
    "COMET_START_ONLINE": "false",
    "COMET_DISABLE_AUTO_LOGGING": "1",
}


class TinyRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(rows: int = 64) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def _fit(tmp_path, loggers, *, profiler_dir=None) -> pl.Trainer:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=loggers,
        profiler=SimpleProfiler(dirpath=profiler_dir, filename="perf") if profiler_dir else None,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(TinyRegression(), train_dataloaders=_loader())
    return trainer


def _artifact_files(client, run_id: str, path: str) -> list[str]:
    """Every artifact file below ``path`` in the run, recursively."""
    found = []
    for info in client.list_artifacts(run_id, path):
        found.extend(_artifact_files(client, run_id, info.path) if info.is_dir else [info.path])
    return sorted(found)


def _comet_archive_assets(offline_directory: str) -> dict[str, list[str]]:
    """Experiment key -> asset file names, read from every offline archive in the folder."""
    assets: dict[str, list[str]] = {}
    for name in sorted(os.listdir(offline_directory)):
        if not name.endswith(".zip"):
            continue
        with zipfile.ZipFile(os.path.join(offline_directory, name)) as archive:
            key = json.loads(archive.read("experiment.json"))["offline_id"]
            for line in archive.read("messages.json").decode().splitlines():
                message = json.loads(line)
                payload = message.get("payload") or {}
                if message.get("type") == "file_upload" and payload.get("upload_type") == "asset":
                    assets.setdefault(key, []).append(payload["additional_params"]["fileName"])
    return {key: sorted(names) for key, names in assets.items()}


@pytest.fixture
def tracker_env(monkeypatch):
    for key, value in TRACKER_ENV.items():
        monkeypatch.setenv(key, value)


# --- one process: global rank 0 -----------------------------------------------------------------


def test_mlflow_sink_uploads_profile_on_rank_zero(tmp_path, tracker_env):
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    profiler_dir = str(tmp_path / "profiler_logs")
    mlflow_logger = MLFlowLogger(experiment_name="sinks", tracking_uri=uri)
    trainer = _fit(tmp_path, [CSVLogger(str(tmp_path)), mlflow_logger], profiler_dir=profiler_dir)
    # A nested file must keep its place below the node folder.
    os.makedirs(os.path.join(profiler_dir, "traces"))
    with open(os.path.join(profiler_dir, "traces", "trace.json"), "w") as handle:
        handle.write("{}")

    share_logger_identity(trainer)
    mlflow_profiler_sink(trainer, profiler_dir)

    identity = getattr(trainer, IDENTITY_ATTR)
    assert identity.mlflow.run_id == mlflow_logger.run_id
    assert identity.comet is None
    client = MlflowClient(uri)
    assert _artifact_files(client, mlflow_logger.run_id, "profiler") == [
        "profiler/node-0/fit-perf.txt",
        "profiler/node-0/traces/trace.json",
    ]
    uploaded = client.download_artifacts(mlflow_logger.run_id, "profiler/node-0/fit-perf.txt",
                                         str(tmp_path / "dl"))
    with open(uploaded) as handle:
        assert "Action" in handle.read()  # SimpleProfiler's report table


def test_relative_mlflow_file_store_is_shared_as_absolute(tmp_path, tracker_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mlflow_logger = MLFlowLogger(experiment_name="rel", tracking_uri="file:./mlruns")
    trainer = _fit(tmp_path, mlflow_logger)
    share_logger_identity(trainer)
    assert getattr(trainer, IDENTITY_ATTR).mlflow.tracking_uri == f"file:{tmp_path / 'mlruns'}"


def test_comet_sink_writes_assets_into_offline_archive(tmp_path, tracker_env):
    offline = str(tmp_path / "comet")
    profiler_dir = str(tmp_path / "profiler_logs")
    comet_logger = CometLogger(project="sinks", offline_directory=offline)
    trainer = _fit(tmp_path, comet_logger, profiler_dir=profiler_dir)

    share_logger_identity(trainer)
    comet_profiler_sink(trainer, profiler_dir)
    comet_logger.experiment.end()  # the offline archive is written when the experiment ends

    key = comet_logger.experiment.get_key()
    identity = getattr(trainer, IDENTITY_ATTR).comet
    assert (identity.experiment_key, identity.online) == (key, False)
    assert identity.offline_directory == offline
    assert _comet_archive_assets(offline) == {key: ["profiler/node-0/fit-perf.txt"]}


def test_disabled_comet_experiment_is_not_shared(tmp_path, tracker_env):
    # online=False makes Lightning build a disabled experiment that never records anything.
    trainer = _fit(tmp_path, CometLogger(project="off", online=False,
                                         offline_directory=str(tmp_path / "c")))
    share_logger_identity(trainer)
    assert getattr(trainer, IDENTITY_ATTR) == LoggerIdentity(mlflow=None, comet=None)


def test_sinks_without_matching_logger_warn_and_return(tmp_path, caplog):
    profiler_dir = str(tmp_path / "profiler_logs")
    trainer = _fit(tmp_path, CSVLogger(str(tmp_path)), profiler_dir=profiler_dir)
    share_logger_identity(trainer)  # no tracker logger: nothing to share, no collective
    assert not hasattr(trainer, IDENTITY_ATTR)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        mlflow_profiler_sink(trainer, profiler_dir)
        comet_profiler_sink(trainer, profiler_dir)
    assert "no MLFlowLogger" in caplog.text
    assert "no CometLogger" in caplog.text


def test_sink_with_no_profiler_files_uploads_nothing(tmp_path, tracker_env, caplog):
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    mlflow_logger = MLFlowLogger(experiment_name="empty", tracking_uri=uri)
    trainer = _fit(tmp_path, mlflow_logger)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        mlflow_profiler_sink(trainer, str(tmp_path / "never-written"))
    assert "no files" in caplog.text
    assert MlflowClient(uri).list_artifacts(mlflow_logger.run_id, "profiler") == []


def test_logger_identity_pickles():
    identity = LoggerIdentity()
    assert pickle.loads(pickle.dumps(identity)) == identity


# --- two Ray nodes: the node without global rank 0 exports too -----------------------------------


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


def _train_loop(config: dict) -> None:
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    context = ray.train.get_context()
    node_dir = os.path.join(config["root"], f"node-{context.get_node_rank()}")
    profiler_dir = os.path.join(node_dir, "profiler_logs")
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        logger=[
            MLFlowLogger(experiment_name="multi-node", tracking_uri=config["mlflow_uri"]),
            CometLogger(project="multi-node", offline_directory=config["comet_dir"]),
        ],
        profiler=SimpleProfiler(dirpath=profiler_dir, filename="perf"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=node_dir,
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(TinyRegression(), train_dataloaders=_loader())

    # Before the identity is shared, a sink off global rank 0 cannot reach the run: it must
    # say so and upload nothing (the final artifact listing would show a stray upload).
    early_warnings = []
    if trainer.global_rank != 0:
        handler = _ListHandler(early_warnings)
        logging.getLogger(LOGGER).addHandler(handler)
        try:
            mlflow_profiler_sink(trainer, profiler_dir)
        finally:
            logging.getLogger(LOGGER).removeHandler(handler)

    # What the trainer core does after fit(): share on all ranks, sink on node-local rank 0.
    share_logger_identity(trainer)
    if trainer.local_rank == 0:
        mlflow_profiler_sink(trainer, profiler_dir)
        comet_profiler_sink(trainer, profiler_dir)
    if trainer.global_rank == 0:
        trainer.loggers[1].experiment.end()
    identity = getattr(trainer, IDENTITY_ATTR)
    with open(os.path.join(node_dir, f"rank-{trainer.global_rank}.json"), "w") as handle:
        json.dump({
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "node_ip": ray.util.get_node_ip_address(),
            "run_id": identity.mlflow.run_id,
            "experiment_key": identity.comet.experiment_key,
            "profiles": sorted(os.listdir(profiler_dir)),
            "early_warnings": early_warnings,
        }, handle)


@pytest.fixture(scope="module")
def two_node_run(no_shared_ray, tmp_path_factory):
    from ray.cluster_utils import Cluster
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    root = tmp_path_factory.mktemp("two_node")
    saved_env = {key: os.environ.get(key) for key in TRACKER_ENV}
    os.environ.update(TRACKER_ENV)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False})
    try:
        # Ray Train numbers nodes by IP: distinct loopback addresses make two real node ranks.
        for ip in ("127.0.0.2", "127.0.0.3"):
            cluster.add_node(num_cpus=2, resources={"profnode": 1}, node_ip_address=ip,
                             object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, runtime_env={"env_vars": TRACKER_ENV})
        # The loop and module live in this test file, which Ray workers cannot import.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        config = {"root": str(root), "mlflow_uri": f"file:{root / 'mlruns'}",
                  "comet_dir": str(root / "comet")}
        TorchTrainer(
            _train_loop,
            train_loop_config=config,
            # One "profnode" per node: the two workers must land on different nodes.
            scaling_config=ScalingConfig(num_workers=2,
                                         resources_per_worker={"CPU": 1, "profnode": 1}),
            run_config=RunConfig(name="sinks", storage_path=str(root / "ray_results")),
        ).fit()
        ranks = {}
        for node in ("node-0", "node-1"):
            for name in os.listdir(root / node):
                if name.startswith("rank-"):
                    with open(root / node / name) as handle:
                        ranks[int(name[5:-5])] = json.load(handle)
        yield config, ranks
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
        cluster.shutdown()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_two_nodes_have_distinct_node_ranks(two_node_run):
    _, ranks = two_node_run
    assert sorted(ranks) == [0, 1]
    assert {r["node_rank"] for r in ranks.values()} == {0, 1}
    assert {r["local_rank"] for r in ranks.values()} == {0}
    assert len({r["node_ip"] for r in ranks.values()}) == 2
    # Every rank ends up with rank 0's identity.
    assert len({r["run_id"] for r in ranks.values()}) == 1
    assert len({r["experiment_key"] for r in ranks.values()}) == 1
    for rank in ranks.values():
        assert rank["profiles"], "the profiler wrote nothing on a node"
    assert ranks[0]["early_warnings"] == []
    assert len(ranks[1]["early_warnings"]) == 1
    assert "call share_logger_identity(trainer)" in ranks[1]["early_warnings"][0]


def test_both_nodes_profiles_land_in_the_mlflow_run(two_node_run):
    from mlflow.tracking import MlflowClient

    config, ranks = two_node_run
    run_id = ranks[0]["run_id"]
    files = _artifact_files(MlflowClient(config["mlflow_uri"]), run_id, "profiler")
    expected = sorted(
        f"profiler/node-{r['node_rank']}/{name}" for r in ranks.values() for name in r["profiles"]
    )
    assert files == expected
    assert {path.split("/")[1] for path in files} == {"node-0", "node-1"}


def test_both_nodes_profiles_land_in_the_comet_experiment(two_node_run):
    config, ranks = two_node_run
    key = ranks[0]["experiment_key"]
    assets = _comet_archive_assets(config["comet_dir"])
    assert list(assets) == [key]  # every archive continues rank 0's experiment
    expected = sorted(
        f"profiler/node-{r['node_rank']}/{name}" for r in ranks.values() for name in r["profiles"]
    )
    assert assets[key] == expected


def test_lightning_trainer_ships_both_nodes_profiles(two_node_run, tmp_path):
    """The same guarantee through LightningTrainer, which calls the sinks the way the loop above does."""
    from _models import create_tiny_model, make_regression_datasets
    from mlflow.tracking import MlflowClient
    from ray.train import RunConfig, ScalingConfig

    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer,
        LightningTrainerParam,
    )

    uri = f"file:{tmp_path / 'mlruns'}"
    train, val = make_regression_datasets(64)
    LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_tiny_model,
            create_model_fn_kwargs={},
            train_data=train,
            val_data=val,
            lightning_trainer_kwargs={
                "logger": MLFlowLogger(experiment_name="through-trainer", tracking_uri=uri),
                "profiler": "simple",
            },
            profiler_sink=mlflow_profiler_sink,
        ),
        run_config=RunConfig(name="through-trainer", storage_path=str(tmp_path / "runs")),
        scaling_config=ScalingConfig(num_workers=2,
                                     resources_per_worker={"CPU": 1, "profnode": 1}),
    ).train()

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("through-trainer").experiment_id])
    files = _artifact_files(client, run.info.run_id, "profiler")
    assert {path.split("/")[1] for path in files} == {"node-0", "node-1"}
    assert all(path.endswith(".txt") for path in files)
