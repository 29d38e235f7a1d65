"""A local KubeRay sandbox on kind: ``michelangelo sandbox doctor|create|status|delete``.

``remote-run --kuberay --sandbox`` reads what ``create`` wrote through
:func:`load_sandbox_settings`.
"""

from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._settings import SandboxSettings, load_sandbox_settings, settings_path

__all__ = ["SandboxError", "SandboxSettings", "load_sandbox_settings", "settings_path"]
