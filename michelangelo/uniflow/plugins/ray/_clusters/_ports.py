"""Free loopback ports for the Ray processes (and Serve proxies) we start."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import tempfile
import threading
from collections.abc import Iterator

from michelangelo.errors import ServiceError

try:
    import fcntl
except ImportError:  # Windows: only this process's own ports are remembered
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

_RAY_WORKER_PORTS = (10002, 19999)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = (int(part) for part in handle.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidates(low: int, high: int) -> list[tuple[int, int]]:
    """``[low, high]`` minus the ephemeral range, so no outgoing connection can take the port
    between our check and the moment the real server binds it (which may be minutes later)."""
    eph_low, eph_high = _ephemeral_range()
    spans = [(low, min(high, eph_low - 1)), (max(low, eph_high + 1), high)]
    spans = [(a, b) for a, b in spans if a <= b]
    return spans or [(low, high)]


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class _Reservations:
    """Ports handed out and not yet known to be released, across this user's processes.

    A port is often bound minutes after we pick it (a Serve proxy binds at deploy time), so
    "free right now" alone could hand the same port out twice: to two threads here, or to this
    process and another one (a test and the ``michelangelo`` command it runs, each starting
    servers). Each port handed out gets a file named after it in a folder under the temporary
    directory, holding the owner's process id and start time; the entry lapses when that
    process ends. Without a usable folder, only this process's own ports are remembered.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine: set[int] = set()
        self._folder: str | None = None
        self._swept = False

    def claim(self, port: int) -> bool:
        """Record ``port`` as handed out by this process; False if someone holds it."""
        with self._lock:
            if port in self._mine:
                return False
            with self._shared() as folder:
                if folder is not None and not _claim_file(folder, port):
                    return False
            self._mine.add(port)
            return True

    @contextlib.contextmanager
    def _shared(self) -> Iterator[str | None]:
        """The reservations folder, locked against other processes; None if unusable."""
        folder = self._folder or _reservations_folder()
        if folder is None:
            yield None
            return
        self._folder = folder
        try:
            handle = open(os.path.join(folder, ".lock"), "a")  # noqa: SIM115 (held below)
        except OSError as exc:
            logger.debug("port reservations unavailable in %s: %s", folder, exc)
            yield None
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            if not self._swept:
                _sweep(folder)
                self._swept = True
            yield folder


def _reservations_folder() -> str | None:
    if fcntl is None:  # no file locks, and no os.getuid either
        return None
    folder = os.path.join(tempfile.gettempdir(), f"michelangelo-ports-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        logger.debug("port reservations unavailable in %s: %s", folder, exc)
        return None
    return folder


def _owner_id(pid: int) -> str | None:
    """``"<pid> <start time>"`` for a live process (the start time tells a reused pid apart);
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The start time is the 22nd field; the command name (2nd) may hold spaces.
            fields = handle.read().rsplit(")", 1)[1].split()
        return f"{pid} {fields[19]}"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"{pid} ?"


def _held(path: str) -> bool:
    """Whether the reservation at ``path`` belongs to a process that is still running."""
    try:
        with open(path) as handle:
            owner = handle.read().strip()
        pid = int(owner.split()[0])
    except (OSError, ValueError, IndexError):
        return False
    live = _owner_id(pid)
    return live is not None and (live == owner or live.endswith(" ?") or owner.endswith(" ?"))


def _claim_file(folder: str, port: int) -> bool:
    path = os.path.join(folder, str(port))
    if os.path.exists(path) and _held(path):
        return False
    me = _owner_id(os.getpid()) or f"{os.getpid()} ?"
    try:
        with open(path, "w") as handle:
            handle.write(me)
    except OSError as exc:
        logger.debug("could not reserve port %d in %s: %s", port, folder, exc)
    return True


def _sweep(folder: str) -> None:
    """Drop the reservations of processes that have ended (once per process)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if name.isdigit() and not _held(path):
            with contextlib.suppress(OSError):
                os.unlink(path)


_reservations = _Reservations()


def free_port(low: int = _RAY_WORKER_PORTS[1] + 1, high: int = 65535, host: str = "127.0.0.1") -> int:
    """A port free on ``host`` and on every other address (a Ray agent given a port for its
    node's address also binds it on loopback), outside Ray's worker ports and the kernel's
    ephemeral range, and not handed out before by this process or by another running one."""
    spans = _candidates(low, high)
    weights = [b - a + 1 for a, b in spans]
    for _ in range(200):
        a, b = random.choices(spans, weights=weights)[0]
        port = random.randint(a, b)
        if _binds(host, port) and _binds("", port) and _reservations.claim(port):
            return port
    raise ServiceError(f"no free port between {low} and {high} on {host}")
