"""A local KubeRay sandbox on kind: ``michelangelo sandbox doctor|create|status|delete``.

``remote-run --kuberay --sandbox`` reads what ``create`` wrote through
:func:`load_sandbox_settings`.
"""

from michelangelo.sandbox._create import CreateOptions, create_sandbox
from michelangelo.sandbox._delete import delete_sandbox
from michelangelo.sandbox._doctor import ToolReport, doctor
from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._settings import SandboxSettings, load_sandbox_settings, settings_path
from michelangelo.sandbox._status import Part, sandbox_status

__all__ = [
    "CreateOptions",
    "Part",
    "SandboxError",
    "SandboxSettings",
    "ToolReport",
    "create_sandbox",
    "delete_sandbox",
    "doctor",
    "load_sandbox_settings",
    "sandbox_status",
    "settings_path",
]
