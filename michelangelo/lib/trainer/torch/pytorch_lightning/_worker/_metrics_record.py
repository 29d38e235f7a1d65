"""Every metric Lightning logs, kept as JSON lines with the run, whatever loggers are set.

Lightning sends logged values to its loggers through one method of the trainer's logger
connector; this callback wraps that method on global rank 0, so it sees exactly what a
logger would see (at the same steps, ``log_every_n_steps`` included) even with
``logger=False``. Rows are ``{"name", "value", "step", "epoch", "time"}``; the file is
written every few seconds and when the fit ends or fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback

logger = logging.getLogger(__name__)

__all__ = ["MetricsRecord", "read_metrics"]

FLUSH_EVERY_S = 5.0


class MetricsRecord(Callback):
    """Record logged metrics into ``url`` (a JSON-lines file on any fsspec storage).

    Args:
        url: Destination file; its folder is created.
        flush_every_s: Longest time rows wait in memory.
    """

    def __init__(self, url: str, flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.url = url
        self.flush_every_s = flush_every_s
        self._rows: list[dict[str, Any]] = []
        self._written = 0
        self._last_flush = time.monotonic()
        self._wrapped = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not trainer.is_global_zero or self._wrapped:
            return
        connector = trainer._logger_connector
        original = connector.log_metrics

        def log_metrics(metrics: dict[str, Any], step: int | None = None) -> None:
            with contextlib.suppress(Exception):  # bookkeeping must never fail training
                self._add(trainer, metrics, step)
            return original(metrics, step)

        connector.log_metrics = log_metrics
        self._wrapped = True

    def _add(self, trainer: Any, metrics: dict[str, Any], step: int | None) -> None:
        values = {name: _scalar(value) for name, value in metrics.items()}
        if step is None:
            # Lightning's own choice of step for loggers (see _LoggerConnector.log_metrics).
            step_metric = values.pop("step", None)
            step = (int(step_metric) if step_metric is not None
                    else trainer.fit_loop.epoch_loop._batches_that_stepped)
        now = time.time()
        for name, value in values.items():
            if value is None:
                continue
            self._rows.append({"name": name, "value": value, "step": int(step),
                               "epoch": trainer.current_epoch, "time": now})
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        """Write the rows gathered so far (the file always holds whole lines)."""
        self._last_flush = time.monotonic()
        if self._written == len(self._rows) and self._written:
            return
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        try:
            fs, path = fsspec.core.url_to_fs(self.url)
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if isinstance(fs, LocalFileSystem):
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(_lines(self._rows[self._written:]))
            else:  # object stores cannot append: write the whole file again
                with fs.open(path, "w") as handle:
                    handle.write(_lines(self._rows))
            self._written = len(self._rows)
        except Exception:  # noqa: BLE001 - a full disk must not fail training
            logger.exception("could not write the metrics record to %s", self.url)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self.flush()

    def on_exception(self, trainer: Any, pl_module: Any,
                     exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.flush()


def read_metrics(url: str) -> list[dict[str, Any]]:
    """The rows of a metrics record (a file cut short mid-line loses that line only)."""
    import fsspec

    rows = []
    with fsspec.open(url, "r", encoding="utf-8") as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def _scalar(value: Any) -> float | None:
    with contextlib.suppress(AttributeError, ValueError, RuntimeError, TypeError):
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)
