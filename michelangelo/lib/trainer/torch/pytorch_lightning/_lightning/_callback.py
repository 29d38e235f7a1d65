"""A base for the SDK's own Lightning callbacks that either package's ``Trainer`` accepts.

Importing it imports every installed Lightning package, so only worker-side modules do.
"""

from __future__ import annotations

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning._package import classes

__all__ = ["Callback"]


def _callback_base() -> type:
    bases = classes("callbacks.Callback")
    if len(bases) == 1:
        return bases[0]
    # Both Callback classes are plain classes with the same hooks, so one class can derive
    # from both; either package's Trainer then accepts the SDK's own callbacks.
    return type("Callback", bases, {"__module__": __name__, "__doc__": (
        "A Lightning callback that either installed package's Trainer accepts.")})


Callback = _callback_base()
