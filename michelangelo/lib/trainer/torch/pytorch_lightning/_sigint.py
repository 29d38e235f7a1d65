"""Ctrl-C after a fit: the process's own SIGINT handler again, and no idle controller.

Ray Train's ``fit()``, called in the main thread, installs a SIGINT handler that asks the
run's controller to abort, and leaves it installed when the fit returns. Two things follow in
the user's process (both measured on Ray 2.60 with a plain ``LightningTrainer.fit()``):

- a later Ctrl-C no longer interrupts the script: the handler logs "Gracefully aborting the
  training run" and aborts a controller that has already finished, and the script goes on;
- the handler holds the finished controller's actor handle, so the ``TrainController``
  process (with torch imported) stays alive until the next fit replaces the handler.

:func:`restored_sigint` keeps Ray's handler for the fit itself, where the first Ctrl-C still
aborts the run gracefully, and puts back the handler that was there before when the fit ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def restored_sigint() -> Iterator[None]:
    """Within the block anyone may replace SIGINT's handler; the old one is back after it.

    Outside the main thread nothing is saved or restored: only the main thread may set
    handlers, and Ray Train installs none there. A handler installed outside Python
    (``getsignal`` returns None) cannot be put back and is left as the block leaves it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
