"""Which Lightning package a run trains with: ``pytorch_lightning`` or ``lightning.pytorch``.

Users write modules with either (``import pytorch_lightning as pl`` or ``import lightning as
L``); a module built on one runs under that package's ``Trainer``, decided on the driver from
the module the factory returns. ``_package`` tells the packages apart and refuses a run that
mixes them; ``_callback`` gives the SDK's own callbacks a base both packages accept (loaded on
first use: it imports Lightning).
"""

from typing import TYPE_CHECKING

from michelangelo.lazy import lazy_exports
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning._package import (
    PACKAGES,
    choose,
    classes,
    installed,
    load,
    package_of,
)

if TYPE_CHECKING:
    from michelangelo.lib.trainer.torch.pytorch_lightning._lightning._callback import Callback

__all__ = ["PACKAGES", "Callback", "choose", "classes", "installed", "load", "package_of"]

__getattr__, __dir__ = lazy_exports(__name__, {"Callback": "_callback"}, globals())
