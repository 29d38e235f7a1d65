"""A watchdog on every worker: ranks that stop stepping together fail the run in seconds.

A collective that only some ranks reach (the practice's example: ``self.log(...,
sync_dist=True)`` under ``if self.global_rank == 0``) blocks those ranks until the process
group's timeout, half an hour by default, while the others block in the next collective they
reach. Each rank's :class:`StallWatchdog` notes every batch, backward and optimizer step of the
fit; a thread beside it checks that the fit moved within ``timeout_s``. When it did not, the
thread writes where the fit's thread is (its stack, and the innermost line of user code) into
Ray's key-value store under a per-fit key and ends the process, which fails the Ray Train run.
On the driver, :func:`stalled_ranks` reads those records, and the trainer raises one
:class:`~michelangelo.lib.trainer.torch.pytorch_lightning.TrainingStalledError` listing each
rank's line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from types import FrameType
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback

logger = logging.getLogger(__name__)

__all__ = ["STALL_EXIT_CODE", "StallWatchdog", "stalled_ranks"]

_NAMESPACE = "michelangelo_stall"
STALL_EXIT_CODE = 75
_STACK_FRAMES = 12


def _key(token: str, rank: int) -> str:
    return f"stall-{token}-rank-{rank}"


def _fired_key(token: str) -> str:
    return f"stall-{token}-fired"


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


class StallWatchdog(Callback):
    """Fail this worker when its fit makes no progress for ``timeout_s`` seconds.

    The first rank to notice the stall tells the others (a flag in Ray's key-value store),
    which then record where they are too, so that the driver's error shows every rank.

    Args:
        timeout_s: Longest time between two steps of the fit (a batch, a backward, an
            optimizer step, a validation batch).
        token: Unique to the ``fit()`` call; names this rank's record.
        rank: Ray Train's world rank of this worker.
        world_size: Ray Train's number of workers.
    """

    # How long the first rank to fire waits for the others' records before it ends.
    WAIT_FOR_PEERS_S = 5.0

    def __init__(self, timeout_s: float, token: str, rank: int, world_size: int = 1) -> None:
        self.timeout_s = float(timeout_s)
        self.token = token
        self.rank = rank
        self.world_size = world_size
        self._last = time.monotonic()
        self._where = "starting"
        self._thread_id: int | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # The fit's thread notes its progress --------------------------------------------------

    def _beat(self, where: str) -> None:
        self._last = time.monotonic()
        self._where = where

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._thread_id = threading.get_ident()
        self._beat("training starts")
        self._stop.clear()
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="michelangelo-stall-watchdog")
        self._watcher.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._beat(f"training batch {batch_idx} of epoch {trainer.current_epoch}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._beat(f"after training batch {batch_idx} of epoch {trainer.current_epoch}")

    def on_before_backward(self, trainer, pl_module, loss):
        self._beat(f"backward at step {trainer.global_step}")

    def on_after_backward(self, trainer, pl_module):
        self._beat(f"after backward at step {trainer.global_step}")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._beat(f"optimizer step {trainer.global_step}")

    def on_validation_start(self, trainer, pl_module):
        self._beat("validation starts")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                  dataloader_idx=0):
        self._beat(f"validation batch {batch_idx}")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx=0):
        self._beat(f"after validation batch {batch_idx}")

    def on_validation_end(self, trainer, pl_module):
        self._beat("validation ends")

    def on_train_epoch_end(self, trainer, pl_module):
        self._beat(f"end of epoch {trainer.current_epoch}")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._beat("saving a checkpoint")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.stop()

    def stop(self) -> None:
        """End the watch (training ended, or failed on its own)."""
        self._stop.set()

    # The watching thread --------------------------------------------------------------------

    def _watch(self) -> None:
        every = min(1.0, max(self.timeout_s / 10, 0.05))
        while not self._stop.wait(every):
            idle = time.monotonic() - self._last
            if self._stop.is_set():
                return
            if idle >= self.timeout_s:
                self._fire(idle, first=True)
                return
            if self.world_size > 1 and idle >= every and self._peer_fired():
                self._fire(idle, first=False)
                return

    def _peer_fired(self) -> bool:
        try:
            return bool(_kv()._internal_kv_exists(_fired_key(self.token), namespace=_NAMESPACE))
        except Exception:  # noqa: BLE001 - no store to ask: rely on this rank's own clock
            return False

    def _wait_for_peers(self) -> None:
        deadline = time.monotonic() + self.WAIT_FOR_PEERS_S
        while time.monotonic() < deadline:
            try:
                if all(_kv()._internal_kv_exists(_key(self.token, r), namespace=_NAMESPACE)
                       for r in range(self.world_size)):
                    return
            except Exception:  # noqa: BLE001 - no store to ask: stop waiting
                return
            time.sleep(0.1)

    def _fire(self, idle: float, *, first: bool) -> None:
        frame = sys._current_frames().get(self._thread_id) if self._thread_id else None
        record = {
            "rank": self.rank,
            "noticed": "this rank" if first else "another rank's watchdog",
            "idle_s": round(idle, 1),
            "timeout_s": self.timeout_s,
            "last_progress": self._where,
            "user_line": user_line(frame),
            "stack": "".join(traceback.format_stack(frame)[-_STACK_FRAMES:]) if frame else "",
        }
        logger.error("rank %d: no progress for %.0f s (since %s); stalled at %s", self.rank,
                     idle, self._where, record["user_line"] or "an unknown place")
        try:
            _kv()._internal_kv_put(_key(self.token, self.rank), json.dumps(record),
                                   overwrite=True, namespace=_NAMESPACE)
            if first:
                _kv()._internal_kv_put(_fired_key(self.token), str(self.rank), overwrite=True,
                                       namespace=_NAMESPACE)
                self._wait_for_peers()
        except Exception:  # noqa: BLE001 - end the process all the same
            logger.exception("rank %d: could not record the stall", self.rank)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing to flush
                stream.flush()
        # The fit's thread is blocked in a collective and cannot be interrupted from Python:
        # ending the process is what frees the other ranks and fails the run now.
        os._exit(STALL_EXIT_CODE)


def stalled_ranks(token: str, world_size: int) -> list[dict[str, Any]]:
    """The records the ranks' watchdogs left for the fit ``token`` (removed as read)."""
    internal_kv = _kv()
    with contextlib.suppress(Exception):
        internal_kv._internal_kv_del(_fired_key(token), namespace=_NAMESPACE)
    found = []
    for rank in range(world_size):
        try:
            raw = internal_kv._internal_kv_get(_key(token, rank), namespace=_NAMESPACE)
            if raw:
                internal_kv._internal_kv_del(_key(token, rank), namespace=_NAMESPACE)
                found.append(json.loads(raw))
        except Exception:  # noqa: BLE001 - no record to read: the error stays Ray's own
            logger.debug("no stall record for rank %d", rank, exc_info=True)
    return found


def _library_roots() -> tuple[str, ...]:
    import michelangelo

    paths = sysconfig.get_paths()
    roots = {paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.abspath(michelangelo.__file__)))
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def user_line(frame: FrameType | None) -> str | None:
    """``file:line in function: source`` of the innermost frame outside Python's and the
    installed libraries' code (and the SDK's), or None when the stack has none."""
    roots = _library_roots()
    while frame is not None:
        filename = os.path.realpath(frame.f_code.co_filename)
        if not filename.startswith(roots) and not filename.startswith("<"):
            source = traceback.extract_stack(frame, limit=1)[-1]
            text = (source.line or "").strip()
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}: {text}"
        frame = frame.f_back
    return None
