"""Running the external tools (docker, kind, kubectl, helm) the sandbox drives.

Manifests, and with them the storage credentials, travel on a command's standard input, never
on its command line (other users see command lines in ``ps``). Errors quote the command and
the tail of what it printed, never what it was fed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._settings import cache_root

_TAIL_LINES = 20


def run(argv: Sequence[str], *, input: str | None = None, timeout: float = 300.0,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one tool and return what it printed.

    Args:
        argv: The command line; ``argv[0]`` is looked up on ``PATH``.
        input: Text sent to its standard input (manifests).
        timeout: Seconds before it is ended and the step fails.
        check: Raise when it exits non-zero (otherwise the caller reads ``returncode``).

    Raises:
        SandboxError: The tool is missing, timed out, or (with ``check``) failed.
    """
    exe = require_tool(argv[0])
    try:
        # No input means none at all: a tool that would prompt fails instead of waiting.
        done = subprocess.run([exe, *argv[1:]], input=input, capture_output=True, text=True,
                              timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL if input is None else None)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"'{_show(argv)}' did not finish within {timeout:.0f} s.") from None
    if check and done.returncode != 0:
        raise SandboxError(f"'{_show(argv)}' failed (exit {done.returncode}):\n"
                           + tail(done.stderr or done.stdout))
    return done


def require_tool(name: str) -> str:
    """:func:`find_tool`, or the error that says how to find out what is missing.

    Raises:
        SandboxError: The tool is nowhere to be found.
    """
    exe = find_tool(name)
    if exe is None:
        raise SandboxError(f"'{name}' is not on PATH; run 'michelangelo sandbox doctor' "
                           "to see what is missing and how to install it.")
    return exe


def find_tool(name: str) -> str | None:
    """A tool's path: the build ``--build-images`` made (kind and the kubectl of the node's
    Kubernetes release, at pinned versions) when there is one, else the one on ``PATH``."""
    for folder in built_tool_folders():
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def built_tool_folders() -> list[str]:
    """Folders ``--build-images`` leaves kind and kubectl in, newest version first."""
    root = cache_root()
    if not root.is_dir():
        return []
    return [str(p / "bin") for p in sorted(root.glob("kind-v*"), reverse=True)]


def tail(text: str, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a tool's output, indented for an error message."""
    kept = (text or "").strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in kept) or "    (no output)"


def _show(argv: Sequence[str]) -> str:
    return " ".join(argv)
