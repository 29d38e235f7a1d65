"""The torch process-group settings in a form Ray Train's controller reads without torch.

Ray's ``TorchConfig`` is defined in a module that imports torch at the top. Ray Train starts a
new controller process for every ``fit()``, and that process unpickles the config, so each
training paid a full ``import torch`` (seconds of CPU on a small machine) in a process that
never touches a tensor: the process group is made on the workers. ``ProcessGroupConfig``
holds the same three settings in a torch-free module. Its backend makes the common groups
(gloo, NCCL) by running Ray's own worker-side functions, imported on the workers only, in
the order Ray's backend runs them; any other backend (TPU, HCCL, a mixed or custom one) is
handed to Ray's backend unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import ray
from ray._common.network_utils import build_address
from ray._private.ray_constants import env_integer
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import (
    DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
    TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
)
from ray.train.v2._internal.util import TrainingFramework

from michelangelo.errors import InputError

logger = logging.getLogger(__name__)

__all__ = ["ProcessGroupConfig", "for_controller"]

_INIT_METHODS = ("env", "tcp")
# Backends this module sets up itself; every other one (and None, which TorchTrainer always
# fills in before a fit) goes to Ray's backend as it is.
_OWN_BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass
class ProcessGroupConfig(BackendConfig):
    """``ray.train.torch.TorchConfig``'s settings, readable without importing torch.

    Attributes:
        backend: ``torch.distributed`` backend; None lets ``TorchTrainer`` pick gloo or NCCL.
        init_method: ``"env"`` (``MASTER_ADDR``/``MASTER_PORT``) or ``"tcp"``.
        timeout_s: Seconds before a process-group operation times out.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return _ProcessGroupBackend

    @property
    def train_func_context(self) -> Any:
        # Read on the driver only, where the train function is wrapped; torch is loaded there.
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method,
                "timeout_s": self.timeout_s}

    def as_torch_config(self) -> Any:
        """The same settings as Ray's ``TorchConfig`` (imports torch)."""
        from ray.train.torch.config import TorchConfig

        return TorchConfig(**self.to_dict())


def for_controller(torch_config: Any) -> Any:
    """The config to hand Ray Train in place of ``torch_config``.

    None and a plain ``TorchConfig`` become a :class:`ProcessGroupConfig` with the same
    settings; a subclass of ``TorchConfig`` (``TorchftConfig``, a user's own) is kept, since
    its backend may do more than make a process group.

    Raises:
        ValueError: ``init_method`` is neither ``"env"`` nor ``"tcp"`` (checked here, on the
            driver; Ray's backend would only say so once the workers were up).
    """
    from ray.train.torch.config import TorchConfig

    if torch_config is None:
        return ProcessGroupConfig()
    if type(torch_config) is not TorchConfig:
        return torch_config
    if torch_config.init_method not in _INIT_METHODS:
        raise InputError(
            f"torch_config.init_method={torch_config.init_method!r} is not supported. Fix: "
            "TorchConfig(init_method='env') (MASTER_ADDR/MASTER_PORT) or "
            "TorchConfig(init_method='tcp')."
        )
    return ProcessGroupConfig(backend=torch_config.backend,
                              init_method=torch_config.init_method,
                              timeout_s=torch_config.timeout_s)


class _ProcessGroupBackend(Backend):
    """Makes and ends the process group as Ray's ``_TorchBackend`` does, torch-free here."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: ProcessGroupConfig) -> None:
        backend = backend_config.backend
        if backend not in _OWN_BACKENDS:
            _ray_backend().on_start(worker_group, backend_config.as_torch_config())
            return
        addr, port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "tcp":
            url = f"tcp://{build_address(addr, port)}"
        else:
            worker_group.execute(_set_master, addr=addr, port=port)
            url = "env://"
        worker_group.execute(_set_rank_env)
        size = len(worker_group)
        ray.get([
            worker_group.execute_single_async(
                rank, _init_process_group, backend=backend, world_rank=rank,
                world_size=size, init_method=url, timeout_s=backend_config.timeout_s)
            for rank in range(size)
        ])

    def on_shutdown(self, worker_group: Any, backend_config: ProcessGroupConfig) -> None:
        futures = worker_group.execute_async(_end_process_group,
                                             destroy=len(worker_group) > 1)
        timeout_s = env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning("Torch process group shutdown timed out after %s seconds", timeout_s)


def _ray_backend() -> Backend:
    from ray.train.torch.config import _TorchBackend

    return _TorchBackend()


# Run on the workers. Each imports Ray's torch module there, where torch is wanted anyway.
def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def _set_rank_env() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _init_process_group(**kwargs: Any) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _end_process_group(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)
