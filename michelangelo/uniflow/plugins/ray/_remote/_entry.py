"""The entrypoint of a remote-run Ray job: run one stored task attempt on the cluster.

``python -m michelangelo.uniflow.plugins.ray._remote._entry --storage-url URL --call PATH
--source FILE`` runs in the job's working_dir (the project folder). It connects to the
cluster the job runs on, marks the RayTask's shape active (so Ray Train requests are
checked against it, as in a local run), runs the body through uniflow's
``execute_remote_call`` and exits 0 on success, 1 when the task failed (the error is in the
result file the driver reads).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from michelangelo.uniflow.core.plugin import RemoteCall, Storage, execute_remote_call


def _register_by_value(module: Any, from_file: bool) -> None:
    # A module imported from a file path under a made-up name cannot be imported by Ray
    # workers; its functions (map_batches callables, model factories) travel by value.
    if from_file:
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(module)


@contextlib.contextmanager
def _on_cluster(config: Any) -> Iterator[None]:
    import ray

    from michelangelo.uniflow.plugins.ray._capacity import active_ray_task, install_capacity_check

    install_capacity_check()
    # The job's runtime_env (working_dir, env_vars) already applies to this driver.
    ray.init(logging_level="WARNING")
    try:
        if config is None:
            yield
        else:
            with active_ray_task(config):
                yield
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-url", required=True)
    parser.add_argument("--call", required=True, help="path of the call description in storage")
    parser.add_argument("--source", required=True,
                        help="the task's file, relative to the working dir")
    args = parser.parse_args(argv)
    call = RemoteCall.load(Storage(args.storage_url), args.call)
    print(f"[uniflow] running task {call.call_id} attempt {call.attempt} of run {call.run_id}",
          flush=True)
    ok = execute_remote_call(
        call,
        source_file=os.path.abspath(args.source),
        on_module_loaded=_register_by_value,
        around=_on_cluster,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
