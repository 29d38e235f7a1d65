"""The per-worker training loop that ``LightningTrainer`` hands to Ray Train.

Each worker builds its own model (``create_model_fn``), applies warm starts, builds the
Lightning ``Trainer`` from the driver's resolved arguments and fits it on its dataset shard,
resuming from Ray's latest checkpoint when there is one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputTypeError
from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
    ResolvedKwargs,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest import (
    InMemoryBatches,
    SizedBatches,
    drain_blocks,
    drain_shard,
    rows_per_worker,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import load, package_of
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start import (
    BEFORE,
    apply_initial_weights,
    apply_warm_start,
    at_stage,
    check_initial_weights_fit,
    freeze_layers,
    frozen_names,
    read_initial_weights,
    run_after_configure,
    stage_on_worker,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._advice import PracticeWarnings
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._datamodule import (
    MeasuredBatchSize,
    build_datamodule,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._reporting import (
    CHECKPOINT_NAME,
    EpochEndReport,
    MetricsOnlyReport,
    Reporter,
    report_on_model_checkpoint,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._watchdog import StallWatchdog

logger = logging.getLogger(__name__)

__all__ = ["WorkerSpec", "train_loop_per_worker"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, resolved on the driver (datasets travel separately)."""

    create_model_fn: Callable[..., Any]
    create_model_fn_kwargs: dict[str, Any]
    batch_size: int
    shuffle_buffer_rows: int | None
    collate_fn: Callable[[Any], Any] | None
    resolved: ResolvedKwargs
    train_rows: int
    val_rows: int | None
    initial_weights_path: str | None
    transfer_learning_spec: TransferLearningSpec | None
    # When freezing applies (``_model_stages``); None: this worker decides from its names.
    freeze_stage: str | None
    observer: Any
    experiment_store: Any
    storage_path: str | None
    run_name: str | None
    experiment_dir: str | None
    seed_checkpoint: str | None
    profiler_sink: Callable[[Any, str], Any] | None
    # None with a DataModule: its loaders decide, and MeasuredBatchSize reads it on the worker.
    global_batch_size: int | None
    # In-memory ingest (see _ingest._inmemory_data): decided on the driver, the same for every rank.
    in_memory: bool = False
    shuffle_seed: int = 0
    # Console and run record (see _progress, _metrics_record); None turns each off.
    progress_key: str | None = None
    metrics_url: str | None = None
    # Registry warm starts (see _warm_start): baselines resolved on the driver.
    warm_start: Any = None
    # The memory preflight of the configured model, when only workers can configure it.
    memory_check: Any = None
    # When initial_weights_path applies (``_model_stages``); None: this worker decides.
    initial_weights_stage: str | None = None
    # In memory: each rank's block refs per dataset, split on the driver (None: Ray's shards).
    shard_blocks: dict[str, list[list[Any]]] | None = None
    # With shard_blocks, the driver's Ray Data context, which Ray Train then does not carry over.
    data_context: Any = None
    # The driver's ``seed_everything(seed, workers=...)``: (seed, workers), or None when unseeded.
    seed: tuple[int, bool] | None = None
    # Unique to one fit() call: names its scratch folders on the workers' hosts.
    fit_token: str = "fit"
    # The stall watchdog's limit (see _watchdog); None turns it off.
    stall_timeout_s: float | None = None
    # With fast_dev_run: where rank 0 leaves the metrics for the driver (see MetricsOnlyReport).
    debug_metrics_key: str | None = None
    # Where each rank's profiler report is kept: <storage>/<name>/profiler (None: no profiler).
    profiler_url: str | None = None
    # The data as a LightningDataModule (see _datamodule), instead of Ray datasets.
    create_datamodule_fn: Callable[..., Any] | None = None
    create_datamodule_fn_kwargs: dict[str, Any] | None = None


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point: one Lightning ``fit`` per worker."""
    import ray.train

    from michelangelo.lib.trainer.torch.pytorch_lightning._worker._progress import ProgressReport

    loop_started = time.time()
    spec: WorkerSpec = config["spec"]
    if spec.data_context is not None:  # what Ray Train sets when it has the datasets
        from ray.data import DataContext

        DataContext._set_current(spec.data_context)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()

    if rank == 0 and spec.experiment_store is not None and spec.experiment_dir:
        _track(spec)
    _seed_as_the_driver(spec)
    model, start_callbacks = _build_model(spec, rank, world_size)
    trainer, profiler_dir, reporter = _build_trainer(spec, context)
    trainer.callbacks.extend(start_callbacks)
    progress = [c for c in trainer.callbacks if isinstance(c, ProgressReport)]
    for callback in progress:
        callback.marks["loop_start"] = loop_started
    if spec.create_datamodule_fn is not None:
        data = {"datamodule": build_datamodule(
            spec.create_datamodule_fn, spec.create_datamodule_fn_kwargs or {},
            spec.resolved.package)}
        trainer.callbacks.insert(0, MeasuredBatchSize(
            world_size, spec.resolved.accumulate_grad_batches, reporter.extra_metrics, progress))
    else:
        train_iter, val_iter = _iterables(spec, world_size)
        data = {"train_dataloaders": train_iter, "val_dataloaders": val_iter}
        if rank == 0:
            logger.info("global batch size = %d (per-device %d x %d workers x %d accumulation)",
                        spec.global_batch_size, spec.batch_size, world_size,
                        spec.resolved.accumulate_grad_batches)
            for lg in trainer.loggers:
                with contextlib.suppress(Exception):  # a logger without hparams support
                    lg.log_hyperparams({"global_batch_size": spec.global_batch_size})
    with _resume_checkpoint(spec) as ckpt_path:
        if ckpt_path and rank == 0:
            logger.info("Resuming from %s", ckpt_path)
        trainer.fit(model, ckpt_path=ckpt_path, **data)
    for callback in progress:
        callback.finish(trainer)
    _keep_profiler_report(spec, profiler_dir, context)
    _run_profiler_sink(spec, trainer, profiler_dir, context)


def _seed_as_the_driver(spec: WorkerSpec) -> None:
    """Repeat the driver's ``seed_everything`` here, before the model is built.

    Lightning's own launchers start each rank with the seed in its environment; Ray's workers
    do not inherit the driver's, so without this every rank would start unseeded.
    """
    if spec.seed is None:
        return
    seed, workers = spec.seed
    load(spec.resolved.package).seed_everything(seed, workers=workers, verbose=False)


def _track(spec: WorkerSpec) -> None:
    try:
        spec.experiment_store.track(spec.storage_path, spec.run_name, spec.experiment_dir)
    except Exception:  # noqa: BLE001 - bookkeeping must never fail training
        logger.exception("experiment_store.track failed; continuing without it")


def _build_model(spec: WorkerSpec, rank: int, world_size: int) -> tuple[Any, list[Any]]:
    model = spec.create_model_fn(**spec.create_model_fn_kwargs)
    package = spec.resolved.package
    if not isinstance(model, load(package).LightningModule):
        built_on = package_of(model) or "not a Lightning"
        raise InputTypeError(
            f"create_model_fn returned {type(model).__name__} ({built_on} class) on this "
            f"worker, but the run was set up for a {package} "
            "LightningModule (from the driver's build of it, or from the Lightning objects in "
            "lightning_trainer_kwargs). Fix: return a LightningModule of one package every "
            "time, with callbacks, loggers and strategies from the same package."
        )
    later: list[Callable[[], None]] = []  # steps that need the layers configure_model() builds
    path = spec.initial_weights_path
    if path:
        weights = read_initial_weights(path, rank, world_size)
        stage = spec.initial_weights_stage or stage_on_worker(
            model, lambda m: check_initial_weights_fit(m, weights, path))
        at_stage(stage, lambda: apply_initial_weights(model, weights, path, rank), later)
    start_callbacks = apply_warm_start(model, spec.warm_start, rank, world_size, later)
    at_stage(_freeze_stage(model, spec), lambda: _freeze(model, spec, rank), later)
    if spec.memory_check is not None:
        later.append(lambda: spec.memory_check.run(model))
    after = run_after_configure(model, lambda: [step() for step in later], rank)
    if later and after is None:  # no configure_model(): the model is complete already
        for step in later:
            step()
    elif later:
        start_callbacks.append(after)
    return model, start_callbacks


def _freeze_stage(model: Any, spec: WorkerSpec) -> str:
    if spec.freeze_stage is not None or spec.transfer_learning_spec is None:
        return spec.freeze_stage or BEFORE
    if not spec.transfer_learning_spec.freezes:
        return BEFORE
    # The driver could not place it: decide from this worker's names.
    return stage_on_worker(model, lambda m: frozen_names(
        [n for n, _ in m.named_parameters()], spec.transfer_learning_spec))


def _freeze(model: Any, spec: WorkerSpec, rank: int) -> None:
    frozen = freeze_layers(model, spec.transfer_learning_spec)
    if frozen and rank == 0:
        logger.info("Froze %d parameters: %s", len(frozen), frozen)


def _iterables(spec: WorkerSpec, world_size: int) -> tuple[Any, Any]:
    import ray.train

    if spec.in_memory:
        return _in_memory_iterables(spec)
    train = SizedBatches(
        ray.train.get_dataset_shard("train"),
        rows_per_worker(spec.train_rows, world_size),
        spec.batch_size,
        spec.shuffle_buffer_rows if _shuffles(spec) else None,
        spec.collate_fn,
    )
    val = None
    if spec.val_rows is not None:
        val = SizedBatches(
            ray.train.get_dataset_shard("val"),
            rows_per_worker(spec.val_rows, world_size),
            spec.batch_size,
            None,  # validation order does not matter; skip the buffer's cost
            spec.collate_fn,
        )
    return train, val


def _shuffles(spec: WorkerSpec) -> bool:
    """Whether the training batches are shuffled: not with ``overfit_batches``, which must see
    the same batches every epoch (Lightning turns a DataLoader's shuffling off there too)."""
    return (spec.shuffle_buffer_rows is not None
            and not spec.resolved.trainer_kwargs.get("overfit_batches"))


def _in_memory_iterables(spec: WorkerSpec) -> tuple[InMemoryBatches, InMemoryBatches | None]:
    """Drain this worker's shards once; batches then come from memory every epoch."""
    import ray.train
    from ray.train.torch import get_device

    rank = ray.train.get_context().get_world_rank()
    pin = get_device().type == "cuda"  # pinned host memory speeds up the copies to the GPU

    def drain(name: str) -> Any:
        if spec.shard_blocks is not None:
            return drain_blocks(spec.shard_blocks[name][rank])
        return drain_shard(ray.train.get_dataset_shard(name))

    train = InMemoryBatches(
        drain("train"), spec.batch_size,
        shuffle=_shuffles(spec), seed=spec.shuffle_seed, rank=rank,
        collate_fn=spec.collate_fn, pin_memory=pin,
    )
    val = None
    if spec.val_rows is not None:
        val = InMemoryBatches(
            drain("val"), spec.batch_size, shuffle=False,
            rank=rank, collate_fn=spec.collate_fn, pin_memory=pin,
        )
    return train, val


def _build_trainer(spec: WorkerSpec, context: Any) -> tuple[Any, str, Reporter]:
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import ray_lightning

    pl = load(spec.resolved.package)
    ray_pl = ray_lightning(spec.resolved.package)
    resolved = spec.resolved
    kwargs = dict(resolved.trainer_kwargs)
    callbacks = list(kwargs.pop("callbacks", []))
    measured = {} if spec.global_batch_size is None else {
        "global_batch_size": spec.global_batch_size}
    reporter = Reporter(spec.experiment_dir, spec.observer, measured)
    if spec.debug_metrics_key is not None:
        # A fast_dev_run: Lightning turns checkpointing off for it; report its metrics only.
        callbacks.append(MetricsOnlyReport(reporter, spec.debug_metrics_key))
    elif not report_on_model_checkpoint(callbacks, reporter):
        callbacks.append(EpochEndReport(reporter))
    callbacks += _observing_callbacks(spec, context)
    callbacks.append(PracticeWarnings())
    if spec.stall_timeout_s is not None:
        callbacks.append(StallWatchdog(spec.stall_timeout_s, spec.fit_token,
                                       context.get_world_rank(), context.get_world_size()))
    plugins = kwargs.pop("plugins", None) or []
    plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    plugins.append(ray_pl.environment())
    # The node's profiler folder, one subfolder per rank (Lightning names its files by local
    # rank only, and a retry appends to files of the same name: each attempt starts afresh).
    profiler_dir = os.path.join(
        tempfile.gettempdir(), "michelangelo", f"{context.get_experiment_name()}-{spec.fit_token}",
        "profiler_logs")
    if resolved.profiler is not None:
        rank_dir = _rank_profiler_dir(profiler_dir, context)
        shutil.rmtree(rank_dir, ignore_errors=True)
        os.makedirs(rank_dir, exist_ok=True)
        kwargs["profiler"] = resolved.profiler.build(rank_dir)
    if resolved.logger.given:
        kwargs["logger"] = resolved.logger.build()
    kwargs.setdefault("accelerator", "auto")
    trainer = pl.Trainer(
        devices="auto",
        strategy=resolved.strategy.build(),
        plugins=plugins,
        callbacks=callbacks,
        **kwargs,
    )
    if resolved.strategy.ray_prepared:
        trainer = ray_pl.prepare_trainer(trainer)
    return trainer, profiler_dir, reporter


def _observing_callbacks(spec: WorkerSpec, context: Any) -> list[Any]:
    """The run's own bookkeeping: live progress and the metrics record (rank 0 acts)."""
    from michelangelo.lib.trainer.torch.pytorch_lightning._worker._metrics_record import (
        MetricsRecord,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._worker._progress import ProgressReport

    callbacks: list[Any] = []
    if spec.metrics_url:
        callbacks.append(MetricsRecord(spec.metrics_url))
    if spec.progress_key:
        rows = spec.batch_size * context.get_world_size()
        callbacks.append(ProgressReport(spec.progress_key, rows))
    return callbacks


@contextlib.contextmanager
def _resume_checkpoint(spec: WorkerSpec) -> Iterator[str | None]:
    """Ray's latest checkpoint (native resume, retries) beats the experiment store's seed."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            yield os.path.join(directory, CHECKPOINT_NAME)
        return
    if spec.seed_checkpoint:
        with _local_copy(spec.seed_checkpoint) as directory:
            yield os.path.join(directory, CHECKPOINT_NAME)
        return
    yield None


@contextlib.contextmanager
def _local_copy(url: str) -> Iterator[str]:
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(url)
    if isinstance(fs, LocalFileSystem):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="michelangelo-seed-") as tmp:
        fs.get(path.rstrip("/") + "/", tmp, recursive=True)
        yield tmp


def _rank_profiler_dir(profiler_dir: str, context: Any) -> str:
    """This rank's own folder in the node's profiler folder."""
    return os.path.join(profiler_dir, f"rank-{context.get_world_rank()}")


def _keep_profiler_report(spec: WorkerSpec, profiler_dir: str, context: Any) -> None:
    """Copy this rank's profiler output to ``<storage>/<name>/profiler/rank-<r>/``."""
    if spec.resolved.profiler is None or not spec.profiler_url:
        return
    import fsspec

    rank = context.get_world_rank()
    local = _rank_profiler_dir(profiler_dir, context)
    target = f"{spec.profiler_url.rstrip('/')}/rank-{rank}"
    try:
        files = [os.path.join(d, f) for d, _, names in os.walk(local) for f in names]
        if not files:
            logger.warning("rank %d: the profiler wrote no report under %s", rank, local)
            return
        fs, path = fsspec.core.url_to_fs(target)
        fs.makedirs(path, exist_ok=True)
        for file in files:
            relative = os.path.relpath(file, local).replace(os.sep, "/")
            fs.put_file(file, f"{path.rstrip('/')}/{relative}")
        logger.info("rank %d: profiler report (%d file(s)) kept at %s", rank, len(files), target)
    except Exception:  # noqa: BLE001 - keeping the report must not fail a finished run
        logger.exception("rank %d: could not copy the profiler report to %s", rank, target)


def _run_profiler_sink(spec: WorkerSpec, trainer: Any, profiler_dir: str, context: Any) -> None:
    profiler = spec.resolved.profiler
    # Rank-independent, so every rank takes the same branch around the broadcast below.
    if spec.profiler_sink is None or profiler is None or not profiler.upload:
        return
    try:
        from michelangelo.lib.trainer.torch.pytorch_lightning._worker._profiler_sinks import (
            share_logger_identity,
        )
    except ImportError:
        share_logger_identity = None
    if share_logger_identity is not None:
        share_logger_identity(trainer)
    # Each rank writes its own report when its fit() ends; the sink on local rank 0 reads the
    # node's folder, so it waits until every rank has written (without this, a rank that
    # finished later was missing from what the sink shipped).
    with contextlib.suppress(Exception):
        trainer.strategy.barrier("profiler_sink")
    if context.get_local_rank() != 0:
        return
    try:
        spec.profiler_sink(trainer, profiler_dir)
    except Exception:  # noqa: BLE001 - a failed upload must not fail a finished run
        logger.exception("profiler_sink %r failed; the run itself succeeded", spec.profiler_sink)
