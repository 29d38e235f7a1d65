"""How often Ray Train's controller polls the workers while a ``LightningTrainer`` fit runs.

A Ray Train worker's ``ray.train.report`` puts its result in a queue that holds one item, and
only the controller's poll empties it. The controller polls every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` seconds (2 s by default), so every report after the first
waits for the next poll (1 s on average), and the end of training is noticed up to 2 s late.
A fit that reports once per epoch pays that once per epoch. Measured with
``bench/bench_trainer.py`` (3,200 rows, 2 epochs, 2 workers): from the last batch to the worker
group's shutdown took 4.0 s at 2 s and 0.5 s at 0.25 s.

While a fit runs, this sets the variable to :data:`POLL_INTERVAL_S` unless the user set it.
Ray Train hands the driver's value to the controller it starts. A value the user set is never
touched, and the variable is removed again when the last fit of the process ends, so a
hand-written ``TorchTrainer`` run later in the same process keeps Ray's default.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

ENV_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
POLL_INTERVAL_S = 0.25

_lock = threading.Lock()
_fits_running = 0
_set_by_us = False


@contextlib.contextmanager
def fast_polling() -> Iterator[None]:
    """Within the block, Ray Train controllers started by this process poll every 0.25 s.

    Concurrent fits (threads of one process) share the setting; the last one out removes it.
    """
    global _fits_running, _set_by_us
    with _lock:
        if _fits_running == 0 and ENV_VAR not in os.environ:
            os.environ[ENV_VAR] = str(POLL_INTERVAL_S)
            _set_by_us = True
        _fits_running += 1
    try:
        yield
    finally:
        with _lock:
            _fits_running -= 1
            if _fits_running == 0 and _set_by_us:
                if os.environ.get(ENV_VAR) == str(POLL_INTERVAL_S):
                    del os.environ[ENV_VAR]
                _set_by_us = False
