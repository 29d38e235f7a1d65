"""Checkpoints shared by the trainer, the model registry and serving.

What a model is called (:class:`ModelSpec`) and how the trainer's strategies' checkpoint
formats are read back as plain state dicts. Both the trainer and the registry build on this
package; it imports neither (nor Lightning or Ray).
"""

from michelangelo.lib.checkpoints._formats import (
    CHECKPOINT_NAME,
    CheckpointFormat,
    align_state_dict_keys,
    detect_format,
    expected_formats,
    load_deepspeed_zero,
    load_fsdp2_dcp,
    load_fsdp_sharded,
    load_full_file,
    load_state_dict,
    local_checkpoint,
    resolve_checkpoint_entry,
)
from michelangelo.lib.checkpoints._spec import ModelSpec

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointFormat",
    "ModelSpec",
    "align_state_dict_keys",
    "detect_format",
    "expected_formats",
    "load_deepspeed_zero",
    "load_fsdp2_dcp",
    "load_fsdp_sharded",
    "load_full_file",
    "load_state_dict",
    "local_checkpoint",
    "resolve_checkpoint_entry",
]
