"""What runs on each Ray Train worker: the training loop and what it reports.

``train_loop_per_worker`` builds the model and Lightning's ``Trainer`` from the driver's
``WorkerSpec`` and fits it; around the fit, checkpoints are reported to Ray Train
(``_reporting``), progress goes to the driver's console (``_progress``), logged metrics are
kept with the run (``_metrics_record``) and profiler output reaches the tracking service
(``_profiler_sinks``).
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._worker._loop import (
    WorkerSpec,
    train_loop_per_worker,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._profiler_sinks import (
    comet_profiler_sink,
    mlflow_profiler_sink,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._progress import watch_progress
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._reporting import (
    take_debug_metrics,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._watchdog import stalled_ranks

__all__ = [
    "WorkerSpec",
    "comet_profiler_sink",
    "mlflow_profiler_sink",
    "stalled_ranks",
    "take_debug_metrics",
    "train_loop_per_worker",
    "watch_progress",
]
