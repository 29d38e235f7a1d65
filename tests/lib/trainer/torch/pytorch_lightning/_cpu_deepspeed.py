"""Test-only DeepSpeed strategy that runs on CPU inside Ray Train workers.

Lightning's ``DeepSpeedStrategy`` refuses any accelerator but CUDA, so without this class the
DeepSpeed checkpoint path could only be tested on a GPU machine. DeepSpeed itself runs on CPU
with ``DS_ACCELERATOR=cpu`` and gloo; this subclass removes Lightning's GPU-only guards and
nothing else, so the checkpoints it writes are real ZeRO-2 / ZeRO-3 folders.

It subclasses Ray's ``RayDeepSpeedStrategy`` so that ``ray.train.lightning.prepare_trainer``
and the trainer's strategy resolution accept it like the real thing.

Set ``DS_ACCELERATOR=cpu`` in the worker environment (``runtime_env={"env_vars": ...}``)
*before* DeepSpeed is imported there; :data:`DEEPSPEED_CPU_ENV` holds the variables.
The first run on a machine compiles a DeepSpeed shared-memory op with g++/ninja.
"""

from __future__ import annotations

import os

import torch
from _models import ship_by_value
from lightning_fabric.utilities.seed import reset_seed
from pytorch_lightning.strategies.ddp import DDPStrategy
from ray.train.lightning import RayDeepSpeedStrategy
from typing_extensions import override

# pytest imports this file under a name Ray workers cannot import; send the class by value.
ship_by_value(__name__)

#: Worker environment DeepSpeed needs to pick its CPU accelerator.
DEEPSPEED_CPU_ENV = {"DS_ACCELERATOR": "cpu"}


class CpuDeepSpeedStrategy(RayDeepSpeedStrategy):
    """``RayDeepSpeedStrategy`` with the CUDA-only checks removed, for CPU tests."""

    def __init__(self, *args, **kwargs) -> None:
        # Belt and braces: the runtime_env should already have set it before any import.
        os.environ.update(DEEPSPEED_CPU_ENV)
        kwargs.setdefault("process_group_backend", "gloo")
        super().__init__(*args, **kwargs)

    @property
    @override
    def root_device(self) -> torch.device:
        # DeepSpeed reads the device index; a bare torch.device("cpu") has index None and fails.
        return torch.device("cpu", 0)

    @override
    def setup_environment(self) -> None:
        # Skip DeepSpeedStrategy's "CUDA only" check and go straight to DDP's setup, which
        # calls setup_distributed below.
        DDPStrategy.setup_environment(self)

    @override
    def setup_distributed(self) -> None:
        # The parent's _validate_device_index_selection only makes sense for CUDA devices.
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()
