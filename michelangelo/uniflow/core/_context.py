"""``create_context()``: how a script decides to run its workflow (local-run, remote-run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from michelangelo.uniflow.core._console import Reporter, default_reporter
from michelangelo.uniflow.core._run import Run
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core._workflow import Workflow
from michelangelo.uniflow.core.errors import UserError

_MODES = ("local-run", "remote-run")


class Context:
    """Runs workflows in the way the command line (or the caller) asked for."""

    def __init__(
        self,
        mode: str = "local-run",
        *,
        resume: str | None = None,
        storage_url: str | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        if mode not in _MODES:
            raise UserError(f"mode={mode!r} is not one of {list(_MODES)}.")
        self.mode = mode
        self.resume = resume
        self.storage_url = storage_url
        self.reporter = reporter
        self.last_run_id: str | None = None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run workflow ``fn`` with the given arguments and return its value."""
        if self.mode == "remote-run":
            raise UserError(
                "remote-run submits the workflow to a KubeRay cluster, which this version "
                "cannot do yet. Use local-run (the default) meanwhile."
            )
        name = fn.name if isinstance(fn, Workflow) else getattr(fn, "__name__", "workflow")
        body = fn.fn if isinstance(fn, Workflow) else fn
        run = Run(
            name,
            storage=Storage(self.storage_url),
            reporter=self.reporter or default_reporter(),
            resume=self.resume,
        )
        self.last_run_id = run.run_id
        return run.execute(body, args, kwargs)


def create_context(argv: Sequence[str] | None = None) -> Context:
    """A context configured from the script's command line.

    ``python wf.py`` and ``python wf.py local-run [--resume RUN_ID]`` run locally;
    ``python wf.py remote-run`` is accepted and reports that remote runs are not available yet.
    Arguments that are not a uniflow sub-command (a test runner's, say) are left alone.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _MODES:
        return Context()
    parser = argparse.ArgumentParser(prog=sys.argv[0] if sys.argv else "workflow")
    parser.add_argument("mode", choices=_MODES)
    parser.add_argument("--resume", metavar="RUN_ID", default=None,
                        help="reuse the succeeded tasks of an earlier run")
    parser.add_argument("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
    parsed = parser.parse_args(args)
    return Context(parsed.mode, resume=parsed.resume, storage_url=parsed.storage_url)


def run_callable(name: str, body: Callable[[], Any]) -> Any:
    """Run ``body`` as a run of its own (a task or workflow called outside any context)."""
    run = Run(name, reporter=Reporter())
    return run.execute(lambda: body(), (), {})
