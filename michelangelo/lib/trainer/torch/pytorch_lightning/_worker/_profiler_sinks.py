"""Profiler sinks: ship each node's profiler output to the run of the trainer's MLflow or Comet logger.

Lightning only hands out a real tracking client on global rank 0 (elsewhere ``logger.experiment``
is a no-op dummy), so a sink that relied on it would drop every other node's profile. These sinks
instead rebuild a client from the run's identity (MLflow run id and tracking URI; Comet experiment
key, project and offline folder), which rank 0 broadcasts to all ranks through
:func:`share_logger_identity` right after ``fit()``.

Files land under ``profiler/node-<node_rank>/`` in the run, keeping their layout below
``profiler_dir``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import classes

logger = logging.getLogger(__name__)

# Where share_logger_identity leaves the broadcast identity for the sinks on the same rank.
IDENTITY_ATTR = "_michelangelo_logger_identity"
ARTIFACT_ROOT = "profiler"


@dataclasses.dataclass(frozen=True)
class MlflowRunIdentity:
    """What any process needs to write into the MLflow run that rank 0's logger created.

    Attributes:
        run_id: The MLflow run id.
        tracking_uri: The tracking URI, made absolute for local ``file:`` stores.
    """

    run_id: str
    tracking_uri: str


@dataclasses.dataclass(frozen=True)
class CometExperimentIdentity:
    """What any process needs to add assets to the Comet experiment that rank 0's logger created.

    Attributes:
        experiment_key: The Comet experiment key.
        project: The Comet project name, if any.
        workspace: The Comet workspace, if any.
        online: False when rank 0 logged offline; other ranks then write offline archives too.
        offline_directory: Where offline archives go (None: Comet's default).
    """

    experiment_key: str
    project: str | None
    workspace: str | None
    online: bool
    offline_directory: str | None


@dataclasses.dataclass(frozen=True)
class LoggerIdentity:
    """The tracker runs of a trainer, as rank 0 sees them; the same value on every rank."""

    mlflow: MlflowRunIdentity | None = None
    comet: CometExperimentIdentity | None = None


def share_logger_identity(trainer: Any) -> None:
    """Broadcast rank 0's MLflow/Comet run identity and store it on ``trainer`` on every rank.

    Call it on ALL ranks after ``fit()``: it runs a collective when the trainer has an MLflow
    or Comet logger (every rank has the same loggers, so all ranks agree whether to). It never
    raises; a failure is logged and leaves the sinks to rank 0 only.

    Args:
        trainer: The ``pytorch_lightning.Trainer`` that ran ``fit()``.
    """
    if _find_logger(trainer, "mlflow") is None and _find_logger(trainer, "comet") is None:
        return
    identity: LoggerIdentity | None = None
    if trainer.global_rank == 0:
        identity = _identity_on_rank_zero(trainer)
    try:
        if trainer.world_size > 1:
            identity = trainer.strategy.broadcast(identity, src=0)
    except Exception as error:  # noqa: BLE001 - observability must not fail a finished run
        logger.warning("Could not broadcast the tracker run identity (%s: %s); only rank 0 "
                       "will export profiler output.", type(error).__name__, error)
        identity = identity if trainer.global_rank == 0 else None
    setattr(trainer, IDENTITY_ATTR, identity)


def _logger_and_files(trainer: Any, profiler_dir: str, kind: str,
                      logger_class: str) -> tuple[Any, list[str]] | None:
    """The sink's logger and the files to upload, or None (with a warning) if either is missing."""
    sink = f"{kind}_profiler_sink"
    found = _find_logger(trainer, kind)
    if found is None:
        logger.warning("%s: the trainer has no %s in `loggers`; add one through "
                       "lightning_trainer_kwargs['logger']. Nothing uploaded.", sink, logger_class)
        return None
    files = list(_files_under(profiler_dir))
    if not files:
        logger.warning("%s: no files in %r; nothing uploaded.", sink, profiler_dir)
        return None
    return found, files


def _upload(trainer: Any, profiler_dir: str, kind: str, logger_class: str, identity_name: str,
            *, from_rank_zero: Callable[[Any, list[str], str], None],
            from_peer: Callable[[Any, list[str], str], None]) -> None:
    """The skeleton both sinks share: find the logger and the files, then upload them with the
    logger's own connection on global rank 0, or with the identity
    :func:`share_logger_identity` stored on any other rank (a warning if it is missing)."""
    found = _logger_and_files(trainer, profiler_dir, kind, logger_class)
    if found is None:
        return
    service_logger, files = found
    prefix = _node_prefix(trainer)
    if trainer.global_rank == 0:
        from_rank_zero(service_logger, files, prefix)
        return
    identity = getattr(_identity(trainer), kind)
    if identity is None:
        logger.warning("%s_profiler_sink: rank %d has no %s identity; call "
                       "share_logger_identity(trainer) on all ranks after fit(). Nothing "
                       "uploaded from node %d.", kind, trainer.global_rank, identity_name,
                       trainer.node_rank)
        return
    from_peer(identity, files, prefix)


def mlflow_profiler_sink(trainer: Any, profiler_dir: str) -> None:
    """Upload every file under ``profiler_dir`` to the MLflow run of the trainer's ``MLFlowLogger``.

    Works on any rank: global rank 0 uses the logger's own client; other ranks build
    ``MlflowClient(tracking_uri)`` from the identity :func:`share_logger_identity` stored.
    Files go to ``profiler/node-<node_rank>/`` in the run's artifacts.

    Args:
        trainer: The ``pytorch_lightning.Trainer`` that ran ``fit()``.
        profiler_dir: The node's folder of profiler output.
    """

    def upload(client: Any, run_id: str, files: list[str], artifact_path: str) -> None:
        client.log_artifacts(run_id, profiler_dir, artifact_path=artifact_path)
        logger.info("mlflow_profiler_sink: uploaded %d file(s) from %r to run %s under %r.",
                    len(files), profiler_dir, run_id, artifact_path)

    def from_peer(identity: MlflowRunIdentity, files: list[str], artifact_path: str) -> None:
        from mlflow.tracking import MlflowClient

        upload(MlflowClient(identity.tracking_uri), identity.run_id, files, artifact_path)

    _upload(trainer, profiler_dir, "mlflow", "MLFlowLogger", "MLflow run",
            from_rank_zero=lambda found, files, path: upload(
                found.experiment, found.run_id, files, path),
            from_peer=from_peer)


def comet_profiler_sink(trainer: Any, profiler_dir: str) -> None:
    """Log every file under ``profiler_dir`` as an asset of the trainer's ``CometLogger`` experiment.

    Works on any rank: global rank 0 uses the logger's live experiment; other ranks continue
    the same experiment by its key (an existing online experiment, or an offline archive that
    Comet merges into it on upload) and end it so the archive is written. Assets are named
    ``profiler/node-<node_rank>/<relative path>``.

    Args:
        trainer: The ``pytorch_lightning.Trainer`` that ran ``fit()``.
        profiler_dir: The node's folder of profiler output.
    """

    def from_rank_zero(comet_logger: Any, files: list[str], prefix: str) -> None:
        experiment = comet_logger.experiment
        _log_assets(experiment, profiler_dir, files, prefix)
        # Lightning only flushes at finalize; the experiment stays open for the user.
        experiment.flush()

    def from_peer(identity: CometExperimentIdentity, files: list[str], prefix: str) -> None:
        experiment = _continue_comet_experiment(identity, trainer.node_rank)
        try:
            _log_assets(experiment, profiler_dir, files, prefix)
        finally:
            experiment.end()  # writes the offline archive / drains the online upload queue

    _upload(trainer, profiler_dir, "comet", "CometLogger", "Comet experiment",
            from_rank_zero=from_rank_zero, from_peer=from_peer)


def _continue_comet_experiment(identity: CometExperimentIdentity, node_rank: int) -> Any:
    import comet_ml

    # Only the assets are wanted: keep Comet from logging code, environment or console output.
    config = comet_ml.ExperimentConfig(
        offline_directory=identity.offline_directory,
        log_code=False,
        log_graph=False,
        auto_param_logging=False,
        auto_metric_logging=False,
        auto_log_co2=False,
        parse_args=False,
        auto_output_logging=False,
        log_env_details=False,
        log_git_metadata=False,
        log_git_patch=False,
        log_env_gpu=False,
        log_env_host=False,
        log_env_cpu=False,
        log_env_network=False,
        log_env_disk=False,
        display_summary_level=0,
        distributed_node_identifier=f"node-{node_rank}",
    )
    return comet_ml.start(
        workspace=identity.workspace,
        project=identity.project,
        experiment_key=identity.experiment_key,
        mode="get",
        online=identity.online,
        experiment_config=config,
    )


def _log_assets(experiment: Any, profiler_dir: str, files: list[str], prefix: str) -> None:
    for path in files:
        relative = os.path.relpath(path, profiler_dir).replace(os.sep, "/")
        experiment.log_asset(path, file_name=f"{prefix}/{relative}")
    logger.info("comet_profiler_sink: logged %d file(s) from %r under %r.", len(files),
                profiler_dir, prefix)


def _identity_on_rank_zero(trainer: Any) -> LoggerIdentity:
    # Each tracker is read on its own, so a broken Comet setup does not cost the MLflow export.
    found: dict[str, Any] = {}
    for kind, read in (("mlflow", _mlflow_identity), ("comet", _comet_identity)):
        tracker_logger = _find_logger(trainer, kind)
        if tracker_logger is None:
            continue
        try:
            found[kind] = read(tracker_logger)
        except Exception as error:  # noqa: BLE001 - rank 0 must still join the broadcast
            logger.warning("Could not read the %s run identity on rank 0 (%s: %s); only rank 0 "
                           "will export profiler output there.", kind, type(error).__name__, error)
    return LoggerIdentity(**found)


def _mlflow_identity(mlflow_logger: Any) -> MlflowRunIdentity:
    client = mlflow_logger.experiment
    return MlflowRunIdentity(run_id=mlflow_logger.run_id,
                             tracking_uri=_absolute_uri(client.tracking_uri))


def _comet_identity(comet_logger: Any) -> CometExperimentIdentity | None:
    import comet_ml

    experiment = comet_logger.experiment
    if getattr(experiment, "disabled", False):
        # CometLogger(online=False) builds a disabled experiment that records nothing.
        logger.info("The CometLogger's experiment is disabled; other ranks will not log to it.")
        return None
    offline = isinstance(experiment, comet_ml.OfflineExperiment)
    offline_directory = getattr(experiment, "offline_directory", None) if offline else None
    return CometExperimentIdentity(
        experiment_key=experiment.get_key(),
        project=getattr(experiment, "project_name", None) or comet_logger.name,
        workspace=getattr(experiment, "workspace", None),
        online=not offline,
        offline_directory=os.path.abspath(offline_directory) if offline_directory else None,
    )


def _absolute_uri(uri: str) -> str:
    # A relative "file:" store means the driver's idea of "here"; other processes start elsewhere.
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.abspath(uri[len("file:"):])
    return uri


def _identity(trainer: Any) -> LoggerIdentity:
    return getattr(trainer, IDENTITY_ATTR, None) or LoggerIdentity()


def _find_logger(trainer: Any, kind: str) -> Any | None:
    wanted = classes("loggers.MLFlowLogger" if kind == "mlflow" else "loggers.CometLogger")
    for candidate in getattr(trainer, "loggers", None) or []:
        if isinstance(candidate, wanted):
            return candidate
    return None


def _node_prefix(trainer: Any) -> str:
    return f"{ARTIFACT_ROOT}/node-{int(trainer.node_rank)}"


def _files_under(folder: str) -> Iterator[str]:
    for parent, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            yield os.path.join(parent, name)
