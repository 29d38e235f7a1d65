"""Settings the SDK reads from environment variables, each kind parsed one way.

Every setting is declared here, with its default and the fix a bad value needs, so that
:func:`check_environment` can refuse a bad value when a run starts, on the driver, before
any cluster or worker does; the code that uses a setting reads it through the same object
(``DRIVER_READ_MAX_BYTES.read()``) and gets the same error where it reads it.

A bad value fails with a message that names the variable, the value and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from michelangelo.errors import InputError
from michelangelo.quantity import parse_bytes

__all__ = [
    "DRIVER_READ_MAX_BYTES",
    "DRIVER_READ_MAX_BYTES_DEFAULT",
    "DRIVER_WRITE_MAX_BYTES",
    "TRAINER_INMEMORY",
    "TRAINER_INMEMORY_MAX_BYTES",
    "TRAINER_INMEMORY_MEMORY_FRACTION",
    "ByteSetting",
    "ChoiceSetting",
    "check_environment",
    "set_in_environment",
]


@dataclass(frozen=True)
class ByteSetting:
    """A byte count read from ``name``; :meth:`read` gives ``default`` when it is unset.

    A value is a whole number, a float such as ``2e9``, or a Kubernetes quantity such as
    ``2Gi`` or ``500M`` (the way a RayTask's memory is written).
    """

    name: str
    fix: str
    default: int | None = None

    def read(self) -> int | None:
        """The byte count set, or ``default`` when the variable is unset or blank.

        Raises:
            ValueError: The value is not a byte count of at least 0; the message names the
                variable and the value, and ends with the fix.
        """
        raw = os.environ.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        try:
            return parse_bytes(raw, field=self.name)
        except ValueError:
            raise InputError(
                f"{self.name}={raw!r} is not a byte count. Fix: {self.fix}") from None


@dataclass(frozen=True)
class ChoiceSetting:
    """One of ``choices`` (case-insensitive; ``aliases`` map other words onto them)."""

    name: str
    default: str
    choices: tuple[str, ...]
    fix: str
    aliases: tuple[tuple[str, str], ...] = ()

    def read(self) -> str:
        raw = os.environ.get(self.name, "")
        value = raw.strip().lower() or self.default
        value = dict(self.aliases).get(value, value)
        if value not in self.choices:
            raise InputError(f"{self.name}={raw!r} is not a valid setting. Fix: {self.fix}")
        return value


DRIVER_READ_MAX_BYTES_DEFAULT = 32 * 2**20

DRIVER_READ_MAX_BYTES = ByteSetting(
    "MA_DATASET_DRIVER_READ_MAX_BYTES",
    fix=("set it to a byte count such as 64Mi or 67108864 (0 reads every stored dataset "
         f"through Ray Data), or unset it for {DRIVER_READ_MAX_BYTES_DEFAULT} (32Mi)."),
    default=DRIVER_READ_MAX_BYTES_DEFAULT,
)
"""The largest stored dataset (bytes of Parquet) a task reads in its own process."""

DRIVER_WRITE_MAX_BYTES = ByteSetting(
    "MA_DATASET_DRIVER_WRITE_MAX_BYTES",
    fix=("set it to a byte count such as 64Mi or 67108864 (0 writes every Ray Dataset through "
         f"Ray Data), or unset it for {DRIVER_READ_MAX_BYTES_DEFAULT} (32Mi)."),
    default=DRIVER_READ_MAX_BYTES_DEFAULT,
)
"""The largest materialized Ray Dataset (bytes in memory) a task writes from its own process."""

TRAINER_INMEMORY = ChoiceSetting(
    "MA_TRAINER_INMEMORY", default="auto", choices=("auto", "1", "0"),
    aliases=(("true", "1"), ("on", "1"), ("yes", "1"),
             ("false", "0"), ("off", "0"), ("no", "0")),
    fix="set it to 'auto' (in memory when the shard fits), '1' (always) or '0' (always "
        "stream).",
)
"""Whether a LightningTrainer worker keeps its shard in memory."""

# Unset, a shard may use this share of a worker's memory: one copy of the shard, one permuted
# copy per epoch, and room left for the model, optimizer and activations.
TRAINER_INMEMORY_MEMORY_FRACTION = 0.25

TRAINER_INMEMORY_MAX_BYTES = ByteSetting(
    "MA_TRAINER_INMEMORY_MAX_BYTES",
    fix=("set it to a byte count such as 2Gi or 2000000000 per worker, or unset it to use "
         f"{TRAINER_INMEMORY_MEMORY_FRACTION:.0%} of a worker's memory."),
)
"""The largest shard (train + val) a LightningTrainer worker keeps in memory."""

_DECLARED = (DRIVER_READ_MAX_BYTES, DRIVER_WRITE_MAX_BYTES, TRAINER_INMEMORY,
             TRAINER_INMEMORY_MAX_BYTES)


def check_environment() -> None:
    """Read every declared setting once.

    Raises:
        ValueError: The first bad value, with the variable, the value and the fix.
    """
    for setting in _DECLARED:
        setting.read()


def set_in_environment() -> dict[str, str]:
    """The declared settings this process's environment sets, by variable name.

    What a process that starts work elsewhere (a Ray job on a remote cluster) passes on, so
    that the work there reads the values this process checked.
    """
    return {setting.name: os.environ[setting.name] for setting in _DECLARED
            if os.environ.get(setting.name, "").strip()}
