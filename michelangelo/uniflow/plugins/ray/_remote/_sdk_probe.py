"""Is this SDK on the cluster? Checked once per cluster, before any task's job is submitted.

Every remote job starts ``python -m michelangelo.uniflow.plugins.ray._remote._entry`` with the
cluster's ``python``; on a stock ``rayproject/ray`` image, or a ``ray start`` run from a
virtualenv that was not activated, that module is missing and the job would die after
submission. A short probe job reports which ``michelangelo`` (if any) the job's ``python``
imports and which of the SDK's required distributions it lacks. Then:

- the SDK is there at this client's version: nothing to do;
- it is missing or another version, but its requirements are there: each job carries this
  client's own copy of the package (it is pure Python) as a runtime_env ``py_modules`` entry;
- requirements are missing too: the run stops before any job, naming them and the fix.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from michelangelo.uniflow.core.errors import UserError

_DIST = "michelangelo"
_MARK = "UF-SDK-PROBE "
# Run by the cluster's python with the distributions to look for as its argument; prints one
# marked JSON line. ``find_spec`` decides importability: a dist-info alone (an editable
# install seen without its path hook) does not make the package importable. The folder the
# probe happens to run in does not count (a task job runs in the project folder instead).
_PROBE = (
    "import json, os, sys\n"
    "from importlib import metadata, util\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
    "def version(name):\n"
    "    try:\n"
    "        return metadata.version(name)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        return None\n"
    "sdk = (version('michelangelo') or 'unknown') if util.find_spec('michelangelo') else None\n"
    "want = json.loads(sys.argv[1])\n"
    f"print({_MARK!r} + json.dumps({{'sdk': sdk, 'python': sys.executable, "
    "'missing': [n for n in want if version(n) is None]}))\n"
)


@dataclass(frozen=True)
class SdkOnCluster:
    """What the probe found: the cluster's SDK version (None: not importable), the SDK's
    required distributions its python lacks, and which python that is."""

    version: str | None
    missing: tuple[str, ...]
    python: str


def client_version() -> str:
    """This client's SDK version."""
    try:
        return metadata.version(_DIST)
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without install
        return "unknown"


def client_package_dir() -> str:
    """The folder of this client's ``michelangelo`` package (what ``py_modules`` ships)."""
    import michelangelo

    return os.path.dirname(os.path.abspath(michelangelo.__file__))


def required_distributions() -> list[str]:
    """The distributions the SDK needs whatever extras it runs with (its base requirements)."""
    try:
        requirements = metadata.requires(_DIST) or []
    except metadata.PackageNotFoundError:  # pragma: no cover
        return ["ray"]
    names = []
    for requirement in requirements:
        if "extra" in requirement.partition(";")[2]:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def probe_entrypoint(python: str) -> str:
    """The shell command of the probe job, run with the jobs' ``python``."""
    return " ".join([python, "-c", shlex.quote(_PROBE),
                     shlex.quote(json.dumps(required_distributions()))])


def parse_probe(output: str) -> SdkOnCluster | None:
    """The probe's report from its job output; None when it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith(_MARK):
            data: dict[str, Any] = json.loads(line[len(_MARK):])
            return SdkOnCluster(data.get("sdk"), tuple(data.get("missing") or ()),
                                str(data.get("python") or "python"))
    return None


def needs_shipping(found: SdkOnCluster, *, address: str, python_env: str) -> bool:
    """Whether jobs must carry this client's SDK; raise when shipping it cannot help.

    Args:
        found: The probe's report.
        address: The cluster, for messages.
        python_env: The environment variable that picks the jobs' python, for the fix.

    Raises:
        UserError: The cluster's python lacks distributions the SDK needs.
    """
    if found.missing:
        pins = " ".join(shlex.quote(_pin(name)) for name in found.missing)
        raise UserError(
            f"the cluster at {address} runs jobs with {found.python}, which lacks "
            f"{', '.join(found.missing)} (needed by michelangelo"
            + (f"; it has michelangelo {found.version}" if found.version else
               ", which it does not have either")
            + f"). Fix: install them there (`{found.python} -m pip install {pins}`), use an "
            f"image with michelangelo installed, or set {python_env} to a python on the "
            "cluster's nodes that has them.")
    return found.version != client_version()


def _pin(name: str) -> str:
    """``name`` with the version this client runs, so both sides agree."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:  # pragma: no cover
        return name
