"""``create_context()``: how a script decides to run its workflow (local-run, remote-run)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from michelangelo.settings import check_environment
from michelangelo.uniflow.core._console import Reporter, default_reporter
from michelangelo.uniflow.core._logs import verbose
from michelangelo.uniflow.core._plugin import any_plugin_runs_elsewhere
from michelangelo.uniflow.core._run import Run
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core._workflow import Workflow
from michelangelo.uniflow.core.errors import UserError

_MODES = ("local-run", "remote-run")


@dataclass(frozen=True)
class RunOption:
    """A command-line option a plugin adds to ``python wf.py ...`` and to ``Context(options=)``.

    Attributes:
        name: Key in ``Context.options`` (and ``Run.options``), e.g. ``"ray_address"``.
        flag: The command-line flag, e.g. ``"--ray-address"``.
        help: One line for ``--help``.
        check: Called as ``check(mode, value, options)`` when a context is made (``options``
            holds every option given, for checks that depend on each other); raises
            ``UserError`` for a value that cannot work, before anything starts.
        is_flag: A switch without a value (``--kuberay``); its value is True when given.
    """

    name: str
    flag: str
    help: str
    metavar: str = "VALUE"
    check: Callable[[str, Any, dict[str, Any]], None] | None = None
    is_flag: bool = False


_OPTIONS: dict[str, RunOption] = {}


def register_run_option(option: RunOption) -> None:
    """Make ``option`` known to :class:`Context` and :func:`create_context` (plugins call it)."""
    _OPTIONS[option.name] = option


class Context:
    """Runs workflows in the way the command line (or the caller) asked for."""

    def __init__(
        self,
        mode: str = "local-run",
        *,
        resume: str | None = None,
        storage_url: str | None = None,
        reporter: Reporter | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise UserError(f"mode={mode!r} is not one of {list(_MODES)}.")
        options = dict(options or {})
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise UserError(
                f"Context(options=...): unknown option(s) {unknown}; the imported plugins "
                f"offer {sorted(_OPTIONS) or 'none'}."
            )
        if mode == "remote-run" and not any_plugin_runs_elsewhere():
            raise UserError(
                "remote-run sends task bodies to a cluster, but no plugin that can do so is "
                "imported. Import michelangelo.uniflow.plugins.ray (RayTask) and pass "
                "--ray-address http://HOST:8265."
            )
        for option in _OPTIONS.values():
            if option.check is not None:
                option.check(mode, options.get(option.name), options)
        try:  # the SDK's MA_* settings, read by tasks later: a bad one fails here, up front
            check_environment()
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self.mode = mode
        self.options = options
        self.resume = resume
        self.storage_url = storage_url
        self.reporter = reporter
        self.last_run_id: str | None = None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run workflow ``fn`` with the given arguments and return its value."""
        name = fn.name if isinstance(fn, Workflow) else getattr(fn, "__name__", "workflow")
        body = fn.fn if isinstance(fn, Workflow) else fn
        run = Run(
            name,
            storage=Storage(self.storage_url),
            reporter=self.reporter or default_reporter(),
            resume=self.resume,
            mode=self.mode,
            options=self.options,
        )
        self.last_run_id = run.run_id
        with _sigterm_unwinds():
            return run.execute(body, args, kwargs)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """During a run, SIGTERM unwinds like Ctrl-C: branches stop and clusters are removed.

    Only where nobody handles SIGTERM yet (the michelangelo CLI does so itself), and only in
    the main thread, where Python runs signal handlers.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)):
        yield
        return

    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def create_context(argv: Sequence[str] | None = None) -> Context:
    """A context configured from the script's command line.

    ``python wf.py`` and ``python wf.py local-run [--resume RUN_ID]`` run locally;
    ``python wf.py remote-run --ray-address http://HOST:8265`` runs each RayTask as a Ray job
    on that cluster (options such as ``--ray-address`` come from the imported plugins).
    Arguments that are not a uniflow sub-command (a test runner's, say) are left alone.
    """
    if argv is None:
        _short_failures_in_scripts()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _MODES:
        return Context()
    parser = argparse.ArgumentParser(prog=sys.argv[0] if sys.argv else "workflow")
    parser.add_argument("mode", choices=_MODES)
    parser.add_argument("--resume", metavar="RUN_ID", default=None,
                        help="reuse the succeeded tasks of an earlier run")
    parser.add_argument("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
    for option in _OPTIONS.values():
        if option.is_flag:
            parser.add_argument(option.flag, dest=f"option_{option.name}", default=None,
                                action="store_const", const=True, help=option.help)
        else:
            parser.add_argument(option.flag, dest=f"option_{option.name}", default=None,
                                metavar=option.metavar, help=option.help)
    parsed = parser.parse_args(args)
    options = {name: getattr(parsed, f"option_{name}") for name in _OPTIONS
               if getattr(parsed, f"option_{name}") is not None}
    return Context(parsed.mode, resume=parsed.resume, storage_url=parsed.storage_url,
                   options=options)


def _short_failures_in_scripts() -> None:
    """In a workflow script, end on a failure the console already summarised in one line.

    The summary (task, error, the failing worker's last lines, the logs command) is what the
    user needs; Python's traceback after it repeats the error from uniflow's own frames.
    ``UF_VERBOSE=1`` or ``UF_DEBUG=1`` keeps the traceback.
    """
    previous = sys.excepthook
    if getattr(previous, "__uniflow__", False):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        debug = os.environ.get("UF_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
        keep_traceback = debug or verbose()
        if getattr(exc, "__uniflow_summarized__", False) and not keep_traceback:
            first = (str(exc).strip().splitlines() or [""])[0]
            sys.stderr.write(f"run failed: {kind.__name__}: {first}\n"
                             "(details above; UF_DEBUG=1 shows the Python traceback)\n")
            return
        previous(kind, exc, tb)

    hook.__uniflow__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook
