"""Finding a run's checkpoints again: auto-resume, and the store that remembers run folders.

``plan_resume`` decides at construction whether Ray resumes natively or a checkpoint found
through the ``ExperimentStore`` seeds the run; the reporting of checkpoints from inside
Lightning lives with the worker loop (``_worker``).
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._experiment_store import (
    ExperimentStore,
    FsspecExperimentStore,
    latest_checkpoint_dir,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._resume import (
    ResumePlan,
    as_storage_uri,
    experiment_dir_of,
    plan_resume,
    run_output_dir,
)

__all__ = [
    "ExperimentStore",
    "FsspecExperimentStore",
    "ResumePlan",
    "as_storage_uri",
    "experiment_dir_of",
    "latest_checkpoint_dir",
    "plan_resume",
    "run_output_dir",
]
