"""Lightning Fabric as the body of a Ray Train run: your own loop, Ray's world.

``lightning-in-depth`` keeps Fabric for the loops the Trainer does not fit: you write the
``for`` loop and Fabric brings devices, precision and the distributed strategy. On Ray Train
the processes and the process group already exist, so Fabric must not start any:
:func:`ray_fabric_kwargs` gives ``L.Fabric`` the arguments that make it use them (devices and
nodes from Ray's worker group, and a cluster environment that reads the ranks from Ray Train's
context), and :class:`FabricTrainer` runs the loop on the workers with a folder in the run's
storage for ``fabric.save`` and ``fabric.load``, so that a second run with the same
``storage_path`` and ``name`` resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from michelangelo.errors import InputError, InputTypeError
from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints import run_output_dir
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import installed

logger = logging.getLogger(__name__)

__all__ = ["FabricTrainer", "ray_fabric_kwargs"]

# Fabric's two homes: the `lightning` distribution's and pytorch_lightning's companion.
_FABRIC_OF = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}


def ray_fabric_kwargs(package: str | None = None) -> dict[str, Any]:
    """``L.Fabric(**ray_fabric_kwargs(), precision=...)`` on a Ray Train worker.

    Returns ``devices`` (this node's workers), ``num_nodes``, ``accelerator`` (``"cuda"`` when
    Ray gave the worker a GPU, else ``"cpu"``) and ``plugins`` (a cluster environment whose
    ranks and sizes are Ray Train's). Fabric then joins the process group Ray Train started
    and launches nothing; ``fabric.launch()`` may still be called.

    Args:
        package: ``"lightning.pytorch"`` (``import lightning as L``) or ``"pytorch_lightning"``
            (whose Fabric is ``lightning_fabric``); by default the first installed, in that
            order.

    Raises:
        InputError: Not on a Ray Train worker, or the package is not installed.
    """
    import ray.train
    import ray.train.torch

    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import ray_lightning

    found = installed()
    chosen = package or next((p for p in ("lightning.pytorch", "pytorch_lightning")
                              if p in found), None)
    if chosen not in _FABRIC_OF or chosen not in found:
        raise InputError(
            f"ray_fabric_kwargs(package={package!r}): Fabric needs 'lightning.pytorch' or "
            f"'pytorch_lightning' installed (found {list(found)}). Fix: pip install "
            "'michelangelo[trainer-lightning]'.")
    try:
        context = ray.train.get_context()
        world, local = context.get_world_size(), context.get_local_world_size()
    except Exception as error:  # noqa: BLE001 - any failure here means: not on a worker
        raise InputError(
            "ray_fabric_kwargs() runs inside a Ray Train worker's loop (FabricTrainer's "
            f"train_loop_per_worker), not on the driver ({error}). Fix: build the Fabric in "
            "the loop function.") from None
    if world % local:
        raise InputError(
            f"Fabric needs the same number of workers on every node, but this node has {local} "
            f"of {world}. Fix: ScalingConfig(num_workers=...) a multiple of the workers per "
            "node, or one worker per node.")
    device = ray.train.torch.get_device()
    environment = ray_lightning(chosen).environment()
    return {"accelerator": "cuda" if device.type == "cuda" else "cpu", "devices": local,
            "num_nodes": world // local, "plugins": [environment]}


class FabricTrainer(TorchTrainer):
    """Run a loop that builds ``L.Fabric(...)`` on Ray Train workers.

    The loop receives ``train_loop_config`` with one key added, ``"checkpoint_dir"``: the
    run's folder for Fabric checkpoints, ``<storage_path>/<name>/fabric``, the same for every
    rank (``fabric.save`` writes once, from rank 0, for DDP). Reusing ``storage_path`` and
    ``name`` finds the previous run's checkpoints there, so the loop can ``fabric.load`` them
    and continue.

    Args:
        train_loop_per_worker: ``loop(config)``, called on every worker.
        train_loop_config: Handed to the loop (plus ``checkpoint_dir``).
        scaling_config: Ray Train ``ScalingConfig``.
        run_config: Ray Train ``RunConfig``; its ``storage_path`` and ``name`` place the run.

    Raises:
        TypeError: The loop is not callable, or the config is not a dict.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[[dict[str, Any]], Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        **kwargs: Any,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise InputTypeError(
                f"FabricTrainer(train_loop_per_worker={train_loop_per_worker!r}) must be a "
                "function taking the config dict. Fix: def loop(config): ... and pass loop.")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise InputTypeError(
                f"FabricTrainer(train_loop_config=...) must be a dict, got "
                f"{type(train_loop_config).__name__}. Fix: pass a dict (or nothing).")
        run_config = run_config or RunConfig()
        self.checkpoint_dir = run_output_dir(run_config, "fabric")
        config = {**(train_loop_config or {}), "checkpoint_dir": self.checkpoint_dir}
        super().__init__(train_loop_per_worker, train_loop_config=config,
                         scaling_config=scaling_config or ScalingConfig(),
                         run_config=run_config, **kwargs)
