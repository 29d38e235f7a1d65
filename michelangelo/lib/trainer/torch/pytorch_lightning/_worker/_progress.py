"""Live training progress from global rank 0 to the driver's console.

Rank 0 puts a small state (epoch, step, rows/s, ETA, latest losses) into Ray's GCS key-value
store at most once a second: one small write, no extra process, nothing on other ranks. A
driver thread reads it once a second and hands it to the uniflow run, whose reporter draws
a progress bar on a terminal or prints a line now and then otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback

logger = logging.getLogger(__name__)

__all__ = ["ProgressReport", "watch_progress"]

_NAMESPACE = "michelangelo_progress"
SEND_EVERY_S = 1.0
POLL_EVERY_S = 1.0
_MAX_METRICS = 4


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


class ProgressReport(Callback):
    """On global rank 0, publish the training's progress under ``key`` (throttled).

    Args:
        key: Where the driver looks for it.
        rows_per_batch: Rows one optimizer-free batch holds across all workers.
        every_s: Shortest time between two updates.
    """

    def __init__(self, key: str, rows_per_batch: int, every_s: float = SEND_EVERY_S,
                 loop_started: float | None = None) -> None:
        self.key = key
        self.rows_per_batch = rows_per_batch
        self.every_s = every_s
        self._start = 0.0
        self._last = 0.0
        self._batches = 0
        self._first_step = 0
        # Wall-clock moments the driver turns into phases (see watch_progress).
        self.marks: dict[str, float] = {"loop_start": loop_started or time.time()}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.marks.setdefault("fit_start", time.time())
        self._start = time.monotonic()
        self._first_step = trainer.global_step
        self._batches = 0
        if trainer.is_global_zero:
            self._send(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        if trainer.is_global_zero and time.monotonic() - self._last >= self.every_s:
            self._send(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._send(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks["fit_end"] = time.time()
        if trainer.is_global_zero:
            self._send(trainer, done=True)

    def state(self, trainer: Any, done: bool = False) -> dict[str, Any]:
        """The progress as the console shows it."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        total = trainer.estimated_stepping_batches
        total = int(total) if isinstance(total, int | float) and math.isfinite(total) else None
        step = trainer.global_step
        rate = (step - self._first_step) / elapsed
        eta = (total - step) / rate if total and rate > 0 else None
        metrics = {}
        for name, value in trainer.callback_metrics.items():
            if "loss" in name and len(metrics) < _MAX_METRICS:
                with contextlib.suppress(Exception):
                    metrics[name] = round(float(value), 6)
        max_epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        epoch = trainer.current_epoch
        if max_epochs is not None:
            epoch = min(epoch, max_epochs - 1)  # Lightning counts one past the last at the end
        return {
            "epoch": epoch,
            "max_epochs": max_epochs,
            "step": step,
            "total_steps": total if total and total > 0 else None,
            "rows_per_s": self._batches * self.rows_per_batch / elapsed,
            "eta_s": eta,
            "metrics": metrics,
            "done": done,
            "marks": dict(self.marks),
        }

    def finish(self, trainer: Any) -> None:
        """After ``fit`` returned (checkpoints written, strategy torn down): the last update."""
        self.marks["fit_returned"] = time.time()
        if trainer.is_global_zero:
            self._send(trainer, done=True)

    def _send(self, trainer: Any, done: bool = False) -> None:
        self._last = time.monotonic()
        try:
            _kv()._internal_kv_put(self.key, json.dumps(self.state(trainer, done)),
                                   overwrite=True, namespace=_NAMESPACE)
        except Exception:  # noqa: BLE001 - progress is a nicety; training goes on
            logger.debug("progress update failed", exc_info=True)


@contextlib.contextmanager
def watch_progress(label: str) -> Iterator[str | None]:
    """While the block runs, show the progress rank 0 publishes; yields the key to use.

    In a uniflow task, rank 0 publishes under the key, the run's console shows it (when this
    process has the run: not in a remote attempt), and the training's phases are recorded
    with the task when the block ends. Outside a task it yields None: nothing to publish.
    """
    from michelangelo.uniflow.core import current_call
    from michelangelo.uniflow.core.plugin import active_run

    run = active_run()
    if run is None and current_call() is None:
        yield None
        return
    key = f"{label}-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    called = time.time()
    last: dict[str, Any] = {}

    def poll() -> None:
        while not stop.wait(POLL_EVERY_S):
            last.update(_show(run, label, key) or {})

    thread = None
    if run is not None:
        thread = threading.Thread(target=poll, daemon=True, name="michelangelo-progress")
        thread.start()
    try:
        yield key
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        last.update(_show(run, label, key) or {})
        _record_phases(called, last.get("marks") or {})
        with contextlib.suppress(Exception):
            _kv()._internal_kv_del(key, namespace=_NAMESPACE)
        if run is not None:
            run.progress(label, None)


def _show(run: Any, label: str, key: str) -> dict[str, Any] | None:
    """The state rank 0 last published (shown on ``run``'s console when there is one)."""
    try:
        raw = _kv()._internal_kv_get(key, namespace=_NAMESPACE)
        if raw:
            state = json.loads(raw)
            if run is not None:
                run.progress(label, {k: v for k, v in state.items() if k != "marks"})
            return state
    except Exception:  # noqa: BLE001 - the console must never fail the training
        logger.debug("progress read failed", exc_info=True)
    return None


def _record_phases(called: float, marks: dict[str, float]) -> None:
    """The training's phases, from the driver's fit() call and rank 0's moments."""
    from michelangelo.uniflow.core import record_phases

    ended = time.time()
    steps = [("Ray Train start", called, marks.get("loop_start")),
             ("model and data", marks.get("loop_start"), marks.get("fit_start")),
             ("fit", marks.get("fit_start"), marks.get("fit_end")),
             ("checkpoint and shutdown", marks.get("fit_end"), ended)]
    phases = [(name, end - start) for name, start, end in steps
              if start is not None and end is not None]
    if phases:
        record_phases("LightningTrainer", phases)
