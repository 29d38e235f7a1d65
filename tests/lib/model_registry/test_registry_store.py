"""Revision numbering under concurrency and crashes: exclusive claims, staging, publish.

Real processes on a real local folder: 20 forked registrations at once, and a registration
killed with SIGKILL after it claimed its number and staged its files.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid

import pytest
import torch

from michelangelo.lib.model_registry import ModelRegistry, RevisionNotFoundError
from michelangelo.lib.model_registry._store import ModelStore

_FORK = multiprocessing.get_context("fork")


def _register_after_barrier(root: str, index: int, barrier, results) -> None:
    barrier.wait(timeout=60)
    spec = ModelRegistry(root).register("p", "m", state_dict={"w": torch.full((4,), float(index))},
                                        tags={"index": str(index)})
    results.put((index, spec.revision_id))


def test_twenty_concurrent_processes_get_twenty_distinct_revisions(tmp_path):
    root = str(tmp_path / "registry")
    barrier, results = _FORK.Barrier(20), _FORK.Queue()
    workers = [_FORK.Process(target=_register_after_barrier, args=(root, i, barrier, results))
               for i in range(20)]
    for worker in workers:
        worker.start()
    got = dict(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sorted(got.values()) == list(range(1, 21))
    registry = ModelRegistry(root)
    revisions = registry.list("p", "m")
    assert len(revisions) == 20
    for revision in revisions:  # none lost, none mixed up: each holds its writer's weights
        index = int(revision.tags["index"])
        assert got[index] == revision.revision_id
        assert torch.equal(registry.load_state_dict(revision.spec)["w"],
                           torch.full((4,), float(index)))


def test_concurrent_threads_on_memory_storage():
    registry = ModelRegistry(f"memory://threads-{uuid.uuid4().hex[:8]}")
    ids: list[int] = []

    def register(i: int) -> None:
        ids.append(registry.register("p", "m", state_dict={"w": torch.ones(2) * i}).revision_id)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ids) == list(range(1, 11))


def _register_and_hang_before_publish(root: str, ready) -> None:
    def hang(self, *args, **kwargs):
        ready.set()  # the number is claimed and every file is staged
        time.sleep(600)

    ModelStore.publish = hang  # this forked child only
    ModelRegistry(root).register("p", "m", state_dict={"w": torch.zeros(1000)})


def test_sigkill_part_way_leaves_nothing_visible_and_does_not_block(tmp_path):
    root = str(tmp_path / "registry")
    ready = _FORK.Event()
    child = _FORK.Process(target=_register_and_hang_before_publish, args=(root, ready))
    child.start()
    assert ready.wait(timeout=120)
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    registry = ModelRegistry(root)
    store = registry._store
    assert store.storage.listdir(store.storage.join("p", "m", "ids")) == ["1"]  # claimed
    assert store.storage.listdir(store.storage.join("p", "m", "staging"))  # left behind
    assert registry.list("p") == []
    with pytest.raises(RevisionNotFoundError):
        registry.get("p/m")
    spec = registry.register("p", "m", state_dict={"w": torch.ones(3)})
    assert spec.revision_id == 2
    assert [r.revision_id for r in registry.list("p", "m")] == [2]
    assert torch.equal(registry.load_state_dict("p/m")["w"], torch.ones(3))


def test_stale_staging_folders_are_cleaned(tmp_path):
    registry = ModelRegistry(str(tmp_path / "registry"))
    store = registry._store
    old = store.storage.join("p", "m", "staging", f"{int((time.time() - 7 * 3600) * 1000)}-dead")
    fresh = store.storage.join("p", "m", "staging", f"{int(time.time() * 1000)}-busy")
    store.storage.makedirs(old)
    store.storage.makedirs(fresh)
    registry.register("p", "m", state_dict={"w": torch.ones(1)})
    left = store.storage.listdir(store.storage.join("p", "m", "staging"))
    assert left == [os.path.basename(fresh)]  # another writer's live staging is untouched
