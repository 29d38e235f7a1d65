"""``LightningTrainer``: a ``ray.train.torch.TorchTrainer`` that runs a Lightning fit."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import uuid
import warnings
from typing import Any

from ray.data import DataContext
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints import (
    as_storage_uri,
    experiment_dir_of,
    plan_resume,
    run_output_dir,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
    DeferredMemoryCheck,
    LightningTrainerParam,
    check_all,
    check_memory,
    count_meta_parameters,
    resolve_lightning_kwargs,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._errors import TrainingStalledError
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest import (
    max_workers,
    plan_ingest,
    shuffle_seed,
    split_for_workers,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import package_of
from michelangelo.lib.trainer.torch.pytorch_lightning._poll_interval import fast_polling
from michelangelo.lib.trainer.torch.pytorch_lightning._process_group import for_controller
from michelangelo.lib.trainer.torch.pytorch_lightning._sigint import restored_sigint
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start import (
    MetaModels,
    check_initial_weights_fit,
    check_weights_path,
    first_stage_that_fits,
    frozen_names,
    local_state_dict_shapes,
    plan_warm_start,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker import (
    WorkerSpec,
    train_loop_per_worker,
)

logger = logging.getLogger(__name__)

__all__ = ["LightningTrainer"]


class LightningTrainer(TorchTrainer):
    """Run a PyTorch Lightning training loop on Ray Train workers.

    Everything that can be checked before dispatch is checked in the constructor, on the
    driver: the parameters, the strategy and its kwargs, picklability, precision against
    the devices, the initial weights path, freeze patterns and a memory estimate. The
    capacity check against the cluster runs at the start of :meth:`fit`.

    Args:
        trainer_param: The training run.
        run_config: Ray Train ``RunConfig``. Reusing ``storage_path``/``name`` resumes.
        scaling_config: Ray Train ``ScalingConfig`` (workers and per-worker resources).
        torch_config: Optional ``ray.train.torch.TorchConfig`` (process group backend).
        dataset_config: Optional ``ray.train.DataConfig``.

    Raises:
        ValueError: Any invalid setting, naming the field and the fix.

    Attributes:
        split_for_workers: How in-memory ingest splits the datasets, once per fit on the
            driver: ``split_for_workers(datasets, num_workers)`` returns, per dataset name,
            one list of block references per worker. A subclass may replace it (a test
            double that records the calls, for example); it must keep that contract.
    """

    split_for_workers = staticmethod(split_for_workers)

    def __init__(
        self,
        trainer_param: LightningTrainerParam,
        run_config: RunConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        *,
        torch_config: Any = None,
        dataset_config: Any = None,
    ) -> None:
        if not isinstance(trainer_param, LightningTrainerParam):
            raise InputError(
                f"trainer_param must be a LightningTrainerParam, got {type(trainer_param).__name__}"
                ". Fix: LightningTrainer(trainer_param=LightningTrainerParam(...), ...)."
            )
        scaling_config = scaling_config or ScalingConfig()
        run_config = run_config or RunConfig()
        torch_config = for_controller(torch_config)
        self.trainer_param = trainer_param
        self._own_data_config = dataset_config is not None
        models = MetaModels(trainer_param.create_model_fn, trainer_param.create_model_fn_kwargs)
        # The module decides the Lightning package (its meta build on the driver, else the
        # factory when it is the class itself); the kwargs' Lightning objects must match it.
        self._resolved = resolve_lightning_kwargs(
            trainer_param, package_of(models.raw) or package_of(trainer_param.create_model_fn),
            _datamodule_class(trainer_param))
        check_all(trainer_param, self._resolved, scaling_config)
        self._weights_stage = _plan_initial_weights(trainer_param.initial_weights_path, models)
        self._preflight_model(models, scaling_config)
        self._warm_start = plan_warm_start(trainer_param, self._resolved, models)
        self._resume_plan = plan_resume(run_config, trainer_param.experiment_store)
        datasets: dict[str, Any] = {}
        self._ingest = None
        if not trainer_param.uses_datamodule:
            self._ingest = plan_ingest(trainer_param.train_data, trainer_param.val_data,
                                       scaling_config)
            logger.info("LightningTrainer data ingest: %s", self._ingest.reason)
            datasets["train"] = trainer_param.train_data
            if trainer_param.val_data is not None:
                datasets["val"] = trainer_param.val_data
                _warn_uneven_validation(_cheap_count(trainer_param.val_data,
                                                     self._ingest.val_rows), scaling_config)
        super().__init__(
            train_loop_per_worker=train_loop_per_worker,
            train_loop_config={},
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
        )

    @property
    def global_batch_size(self) -> int | None:
        """Per-device batch x workers x gradient accumulation.

        None with a DataModule: its loaders decide the batch size, on the workers; the run's
        metrics then carry the figure they measured.
        """
        if self.trainer_param.uses_datamodule:
            return None
        return (self.trainer_param.batch_size * max_workers(self.scaling_config)
                * self._resolved.accumulate_grad_batches)

    def fit(self):
        """Check capacity, then run training; returns Ray's ``Result``.

        Raises:
            CapacityError: The ScalingConfig cannot be placed on the cluster.
        """
        self._check_capacity()
        if self.global_batch_size is not None:
            logger.info(
                "LightningTrainer: global batch size %d (batch_size %d x workers x "
                "accumulate_grad_batches %d)", self.global_batch_size,
                self.trainer_param.batch_size, self._resolved.accumulate_grad_batches,
            )
        from michelangelo.lib.trainer.torch.pytorch_lightning._worker import watch_progress

        with watch_progress(_progress_label()) as progress_key:
            spec = self._worker_spec()
            spec = dataclasses.replace(spec, progress_key=progress_key,
                                       metrics_url=_metrics_url(self.run_config, spec),
                                       fit_token=uuid.uuid4().hex[:12],
                                       stall_timeout_s=self.trainer_param.stall_timeout_s)
            if self._resolved.trainer_kwargs.get("fast_dev_run"):
                spec = dataclasses.replace(
                    spec, debug_metrics_key=f"fast-dev-run-{uuid.uuid4().hex}")
            self._debug_metrics_key = spec.debug_metrics_key
            datasets = self.datasets
            workers = self.scaling_config.num_workers
            if (spec.in_memory and isinstance(workers, int) and datasets
                    and not self._own_data_config):
                # Split here, once; Ray Train then has no datasets, so it starts no split
                # coordinator and no dataset manager (see _create_default_callbacks and
                # _ingest._inmemory_data.split_for_workers). A user's DataConfig (datasets not
                # split, its own configure) keeps Ray Train's sharding.
                spec = dataclasses.replace(
                    spec, shard_blocks=self.split_for_workers(datasets, max(workers, 1)),
                    data_context=copy.deepcopy(DataContext.get_current()))
                self.datasets = {}
            self.train_loop_config = {"spec": spec}
            try:
                with fast_polling(), restored_sigint():
                    return super().fit()
            except Exception as error:
                _raise_if_stalled(error, spec, self.scaling_config)
                raise
            finally:
                self.datasets = datasets

    def _create_default_callbacks(self) -> list[Any]:
        """Ray Train's callbacks, less its datasets callback when Ray Train has no datasets.

        With no datasets that callback still starts a dataset manager actor, a process that
        imports Ray Data while the workers start. The workers then get the driver's Ray Data
        context from the ``WorkerSpec`` instead.
        """
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

        callbacks = super()._create_default_callbacks()
        if self.datasets:
            return callbacks
        return [cb for cb in callbacks if type(cb) is not DatasetsCallback]

    def train(self, run_config: RunConfig | None = None) -> dict[str, Any]:
        """Run training and return ``{"checkpoint_path", "path", "metrics"}``.

        Args:
            run_config: Overrides the constructor's ``RunConfig``. Auto-resume is decided at
                construction and is not re-evaluated; prefer the constructor argument.

        Returns:
            ``checkpoint_path``: the latest reported checkpoint folder (None if none);
            ``path``: the Ray result path of the run; ``metrics``: the final reported
            metrics, including ``global_batch_size``.
        """
        if run_config is not None:
            self._override_run_config(run_config)
        self._debug_metrics_key = None
        result = self.fit()
        metrics = dict(result.metrics or {})
        if self._debug_metrics_key is not None:  # a fast_dev_run: no checkpoint carried them
            from michelangelo.lib.trainer.torch.pytorch_lightning._worker import (
                take_debug_metrics,
            )

            metrics = {**take_debug_metrics(self._debug_metrics_key), **metrics}
        if self.global_batch_size is not None:  # else the workers measured it (a DataModule)
            metrics["global_batch_size"] = self.global_batch_size
        checkpoint_path = as_storage_uri(
            result.checkpoint.path if result.checkpoint is not None else None, self.run_config)
        self._say_what_the_flags_did(checkpoint_path)
        observer = self.trainer_param.training_observer
        if observer is not None:
            observer.on_result(dict(metrics), checkpoint_path)
        return {"checkpoint_path": checkpoint_path,
                "path": as_storage_uri(result.path, self.run_config), "metrics": metrics}

    def _say_what_the_flags_did(self, checkpoint_path: str | None) -> None:
        """After a run with Lightning's debugging flags: what they left, and where."""
        kwargs = self._resolved.trainer_kwargs
        fast = kwargs.get("fast_dev_run")
        if fast and checkpoint_path is None:
            warnings.warn(
                f"lightning_trainer_kwargs['fast_dev_run']={fast!r}: Lightning ran "
                f"{1 if fast is True else fast} batch(es) through every hook and wrote no "
                "checkpoint (a fast_dev_run turns checkpointing and loggers off), so "
                "checkpoint_path is None; the metrics are the debug run's. Fix: remove "
                "fast_dev_run for a real run.", UserWarning, stacklevel=3)
        url = self._profiler_url()
        if url is not None:
            message = (f"[michelangelo] profiler reports, one folder per rank: {url}/rank-<r>/ "
                       f"(rank-0 ... rank-{max_workers(self.scaling_config) - 1})")
            logger.info(message)
            print(message, file=sys.stderr)

    def _override_run_config(self, run_config: RunConfig) -> None:
        from ray.train.v2._internal.execution.context import TrainRunContext

        if self.trainer_param.experiment_store is not None:
            warnings.warn(
                "run_config was passed to train() while an experiment_store is configured: the "
                "override is applied, but auto-resume was decided at construction and is not "
                "re-evaluated. Fix: pass run_config to LightningTrainer(...) instead.",
                UserWarning,
                stacklevel=3,
            )
            logger.warning("run_config passed to train() with an experiment_store configured")
        self.run_config = run_config
        # Ray Train V2 froze the run context in __init__; rebuild it so fit() is consistent.
        self.train_run_context = TrainRunContext(
            run_config=run_config,
            train_loop_config=self.train_loop_config,
            scaling_config=self.scaling_config,
            backend_config=self.backend_config,
            dataset_config=self.data_config,
        )

    @property
    def memory_estimate(self) -> Any:
        """The memory preflight's figures (parameters, bytes per worker, budget), or None.

        None when the model could not be built on the meta device or no per-worker memory
        is declared (``resources_per_worker['memory']`` or the RayTask's worker memory).
        """
        return self._memory_estimate

    def _preflight_model(self, models: MetaModels, scaling_config: ScalingConfig) -> None:
        self._memory_estimate = None
        self._deferred_memory_check = None
        self._freeze_stage = None
        spec = self.trainer_param.transfer_learning_spec
        if spec is not None and spec.freezes:
            fits = first_stage_that_fits(
                models, lambda m: frozen_names([n for n, _ in m.named_parameters()], spec))
            self._freeze_stage = fits[0] if fits is not None else None
        model = models.configured  # the whole model, as it trains
        if model is None:
            if models.configured_unknown:  # configure_model() runs only on the workers
                self._deferred_memory_check = DeferredMemoryCheck.plan(
                    self._resolved.strategy, scaling_config)
            return
        self._memory_estimate = check_memory(count_meta_parameters(model),
                                             self._resolved.strategy, scaling_config)

    def _profiler_url(self) -> str | None:
        """``<storage>/<name>/profiler``, where each rank keeps its report; None: no profiler."""
        if self._resolved.profiler is None:
            return None
        return run_output_dir(self.run_config, "profiler")

    def _check_capacity(self) -> None:
        from michelangelo.uniflow.plugins.ray import check_fits, current_shape

        shape = current_shape(live_fallback=True)
        if shape is None:
            logger.debug("Capacity check skipped: no RayTask and Ray is not initialised yet")
            return
        check_fits(self.scaling_config, shape)

    def _worker_spec(self) -> WorkerSpec:
        param = self.trainer_param
        in_memory, train_rows, val_rows = False, 0, None
        if self._ingest is not None:
            in_memory = self._ingest.in_memory
            # In memory, each worker counts its own shard as it reads it: counting on the
            # driver would execute a lazy dataset once more before the workers read it.
            train_rows = 0 if in_memory else _count(param.train_data, self._ingest.train_rows)
            if param.val_data is not None:
                val_rows = 0 if in_memory else _count(param.val_data, self._ingest.val_rows)
        return WorkerSpec(
            create_model_fn=param.create_model_fn,
            create_model_fn_kwargs=dict(param.create_model_fn_kwargs),
            batch_size=param.batch_size,
            shuffle_buffer_rows=param.shuffle_buffer_rows,
            collate_fn=param.data_collate_fn,
            resolved=self._resolved,
            train_rows=train_rows,
            val_rows=val_rows,
            initial_weights_path=param.initial_weights_path,
            transfer_learning_spec=param.transfer_learning_spec,
            freeze_stage=self._freeze_stage,
            observer=param.training_observer,
            experiment_store=param.experiment_store,
            storage_path=self.run_config.storage_path,
            run_name=self.run_config.name,
            experiment_dir=experiment_dir_of(self.run_config),
            seed_checkpoint=self._resume_plan.seed_checkpoint,
            profiler_sink=param.profiler_sink,
            global_batch_size=self.global_batch_size,
            in_memory=in_memory,
            shuffle_seed=shuffle_seed(experiment_dir_of(self.run_config)),
            warm_start=self._warm_start,
            memory_check=self._deferred_memory_check,
            initial_weights_stage=self._weights_stage,
            seed=_driver_seed(),
            profiler_url=self._profiler_url(),
            create_datamodule_fn=param.create_datamodule_fn,
            create_datamodule_fn_kwargs=dict(param.create_datamodule_fn_kwargs),
        )


def _cheap_count(dataset: Any, counted: int | None) -> int | None:
    """Rows of ``dataset`` when known without running it: counted already, or materialized."""
    from ray.data.dataset import MaterializedDataset

    if counted is not None:
        return counted
    return dataset.count() if isinstance(dataset, MaterializedDataset) else None


def _warn_uneven_validation(val_rows: int | None, scaling_config: ScalingConfig) -> None:
    """One warning when ``val_data`` does not split evenly over the workers (rows left out)."""
    workers = scaling_config.num_workers
    if val_rows is None or not isinstance(workers, int) or workers <= 1:
        return
    left_out = val_rows % workers
    if not left_out:
        return
    warnings.warn(
        f"LightningTrainerParam.val_data has {val_rows} rows, which do not split evenly over "
        f"{workers} workers: every worker validates on {val_rows // workers} rows and "
        f"{left_out} row(s) are left out of the validation metrics (Ray splits datasets into "
        f"equal shards). Fix: for exact metrics, give val_data a multiple of {workers} rows "
        f"(e.g. {val_rows - left_out} or {val_rows - left_out + workers}).",
        UserWarning, stacklevel=4)


def _raise_if_stalled(error: Exception, spec: WorkerSpec, scaling_config: ScalingConfig) -> None:
    """Raise one ``TrainingStalledError`` when the ranks' watchdogs ended the run."""
    from michelangelo.lib.trainer.torch.pytorch_lightning._worker import stalled_ranks

    records = stalled_ranks(spec.fit_token, max_workers(scaling_config))
    if not records:
        return
    lines = []
    for record in sorted(records, key=lambda r: r["rank"]):
        where = record.get("user_line") or "outside your code (see its stack below)"
        lines.append(f"  rank {record['rank']}: {where} (no progress for {record['idle_s']:.0f} "
                     f"s, since {record['last_progress']})")
    stacks = "\n".join(f"--- rank {r['rank']} ---\n{r['stack']}"
                       for r in sorted(records, key=lambda r: r["rank"]))
    raise TrainingStalledError(
        f"Training stalled: the ranks stopped stepping together, and the fit made no progress "
        f"for stall_timeout_s={spec.stall_timeout_s:g} s. Where each rank was blocked:\n"
        + "\n".join(lines) + "\n"
        "This is almost always a collective that only some ranks reach: self.log(..., "
        "sync_dist=True), all_gather or a barrier under `if self.global_rank == 0`, or a "
        "different number of batches per rank. Fix: run the same collectives on every rank (log "
        "on all ranks, or use rank_zero_only=True without sync_dist); if one step really takes "
        "this long, raise LightningTrainerParam.stall_timeout_s.\n" + stacks
    ) from error


def _datamodule_class(param: LightningTrainerParam) -> tuple[str, Any] | None:
    """``(label, class)`` when ``create_datamodule_fn`` is the DataModule class itself, so its
    package can be checked against the module's on the driver; a function only tells on the
    workers."""
    factory = param.create_datamodule_fn
    if isinstance(factory, type):
        return "LightningTrainerParam.create_datamodule_fn", factory
    return None


def _progress_label() -> str:
    from michelangelo.uniflow.core import current_call

    call = current_call()
    return call.call_id if call is not None else "training"


def _metrics_url(run_config: RunConfig, spec: WorkerSpec) -> str | None:
    """Where the metrics record goes: the task's folder in the run, else the experiment's."""
    from michelangelo.uniflow.core import current_call, record_artifact

    call = current_call()
    name = run_config.name or "training"
    if call is not None:
        relative = f"metrics/{name}-attempt-{call.attempt}.jsonl"
        record_artifact("metrics", name=name, path=relative)
        return f"{call.scratch_url}/{relative}"
    return f"{spec.experiment_dir}/metrics.jsonl" if spec.experiment_dir else None


def _driver_seed() -> tuple[int, bool] | None:
    """``(seed, workers)`` of the driver's ``seed_everything`` call, or None if it made none.

    Both Lightning packages record the call in the process environment (``PL_GLOBAL_SEED``,
    ``PL_SEED_WORKERS``); that is what their own launchers pass to each rank.
    """
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is None:
        return None
    try:
        value = int(seed)
    except ValueError:
        return None
    return value, os.environ.get("PL_SEED_WORKERS", "0") == "1"


def _count(dataset: Any, counted: int | None) -> int:
    """Rows of ``dataset``, reusing the count the ingest decision already made."""
    return counted if counted is not None else dataset.count()


def _plan_initial_weights(path: str | None, models: MetaModels) -> str | None:
    """Where ``initial_weights_path`` applies: as the factory returns the model, or after
    ``configure_model()``; None when only the workers can tell (a URL, a hook that needs the
    distributed run). Keys that fit neither shape fail here as they would on every worker.
    """
    if not path:
        return None
    check_weights_path(path)
    shapes = local_state_dict_shapes(path)
    if shapes is None:
        return None
    fits = first_stage_that_fits(models, lambda m: check_initial_weights_fit(m, shapes, path))
    return fits[0] if fits is not None else None
