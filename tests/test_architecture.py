"""The package rules, read from the source with ``ast`` (nothing is imported, so it is fast).

A *package* is every directory under ``michelangelo/`` that has an ``__init__.py``; a parent
and its subpackages are different packages (``plugins.ray`` and ``plugins.ray.kuberay``,
``uniflow.core`` and ``uniflow.core.lib``). Three rules:

1. A module may import underscored modules and names only from its own package. Everything
   another package needs is a public name of that package (``uniflow.core.plugin``,
   ``plugins.ray.provisioning``, ``plugins.ray.standing``, ...).
2. The imports between packages form no cycle.
3. Within one package, the imports between its modules form no cycle either, so that no
   module needs a deferred import to reach a sibling. A package's ``__init__`` is one of its
   modules: its imports of the others are edges. A module that imports its own package's
   face (``from michelangelo.uniflow.core import Task`` inside ``uniflow.core``) imports
   that ``__init__``, which is what Python runs too; where the ``__init__`` imports the
   module back, directly or through others, that is a cycle with ``__init__`` in it: import
   the sibling module directly instead. Imports of subpackages and parents belong to rule 2.

Examples (``examples/``) import only public names, like any user; so do benchmarks
(``bench/``), but for the internals that ``BENCH_INTERNALS`` lists with a reason.

Every import statement counts, wherever it is: module level, inside functions, under
``TYPE_CHECKING`` (an import that only a type checker runs is still a dependency a reader
follows, and a deferred import is how a cycle hides). Imports by string (``importlib.import_module``, entry points) are not
statements and are not seen; the Ray plugin loads KubeRay through an entry point on purpose,
so that KubeRay depends on the plugin and not the other way round.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Import:
    """One imported module (and the name taken from it, for ``from m import name``)."""

    source: pathlib.Path
    line: int
    module: str
    name: str | None


class Tree:
    """The packages and imports of the ``michelangelo`` source below ``root``."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.packages = {
            ".".join(init.parent.relative_to(root).parts)
            for init in (root / "michelangelo").rglob("__init__.py")
        }

    def module_name(self, path: pathlib.Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def package_of(self, module: str) -> str | None:
        """The innermost package that holds ``module`` (a module or a package name)."""
        parts = module.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in self.packages:
                return candidate
        return None

    def is_module(self, dotted: str) -> bool:
        path = self.root.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    def imports(self) -> Iterator[Import]:
        for path in sorted((self.root / "michelangelo").rglob("*.py")):
            me = self.module_name(path)
            here = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        yield Import(path, node.lineno, alias.name, None)
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = here[: len(here) - (node.level - 1)]
                        module = ".".join(base + ([node.module] if node.module else []))
                    else:
                        module = node.module or ""
                    for alias in node.names:
                        submodule = f"{module}.{alias.name}"
                        if self.is_module(submodule):  # `from pkg import module`
                            yield Import(path, node.lineno, submodule, None)
                        else:
                            yield Import(path, node.lineno, module, alias.name)

    def own_imports(self) -> Iterator[tuple[str, str, Import]]:
        """(importing package, imported package, import) for imports of other packages."""
        for imp in self.imports():
            if not imp.module.startswith("michelangelo"):
                continue
            mine = self.package_of(self.module_name(imp.source))
            theirs = self.package_of(imp.module)
            if theirs is not None and mine is not None and mine != theirs:
                yield mine, theirs, imp

    def private_imports(self) -> list[str]:
        """Imports of another package's underscored module or name, as readable lines."""
        found = []
        for _mine, theirs, imp in self.own_imports():
            inside = imp.module[len(theirs):].split(".")
            names = [*inside, imp.name or ""]
            if any(p.startswith("_") and not p.startswith("__") for p in names if p):
                what = imp.module + (f" import {imp.name}" if imp.name else "")
                found.append(f"{imp.source.relative_to(self.root)}:{imp.line}: {what}")
        return found

    def graph(self) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {package: set() for package in self.packages}
        for mine, theirs, _imp in self.own_imports():
            edges[mine].add(theirs)
        return edges

    def cycles(self) -> list[list[str]]:
        """The strongly connected groups of packages: each one holds a cycle."""
        return _strongly_connected(self.graph())

    def module_graph(self) -> dict[str, set[str]]:
        """Module -> the modules of its own package it imports (``__init__`` as the package)."""
        modules = {self.module_name(path) for path in (self.root / "michelangelo").rglob("*.py")}
        edges: dict[str, set[str]] = {module: set() for module in modules}
        for imp in self.imports():
            me = self.module_name(imp.source)
            if imp.module in modules and imp.module != me and (
                    self.package_of(imp.module) == self.package_of(me)):
                edges[me].add(imp.module)
        return edges

    def module_cycles(self) -> list[str]:
        """Each cycle between modules of one package: ``package: module, module, ...``."""
        found = []
        for group in _strongly_connected(self.module_graph()):
            package = self.package_of(group[0])
            names = sorted("__init__" if m == package else m.rsplit(".", 1)[1] for m in group)
            found.append(f"{package}: {', '.join(names)}")
        return found


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each one sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(groups)

def test_no_package_imports_another_packages_private_modules_or_names():
    found = Tree(ROOT).private_imports()
    assert not found, (
        "These imports reach into another package's underscored module or name. Import a "
        "public name instead (add it to that package's __init__ or a public module such as "
        "michelangelo.uniflow.core.plugin):\n" + "\n".join(found))


def _private_in(root: pathlib.Path, folder: str) -> list[str]:
    """Imports of underscored ``michelangelo`` modules or names in the scripts under ``folder``."""
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] == "michelangelo" and any(
                        p.startswith("_") and not p.startswith("__") for p in parts):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {target}")
    return found


def _private_in_examples(root: pathlib.Path) -> list[str]:
    return _private_in(root, "examples")


def test_examples_import_only_public_names():
    found = _private_in_examples(ROOT)
    assert not found, "Examples must use public names only:\n" + "\n".join(found)


# Benchmarks that time one internal piece on its own, which no public name offers (a face for
# them would exist only for the benchmark). Each entry is "file: imported name"; everything
# else a benchmark imports must be public, like a user's script.
BENCH_INTERNALS = {
    # Ray Data batches vs the trainer's in-memory batches, without a training loop around them.
    "bench/bench_ingest.py: michelangelo.lib.trainer.torch.pytorch_lightning._ingest._data.SizedBatches",
    "bench/bench_ingest.py: michelangelo.lib.trainer.torch.pytorch_lightning._ingest._inmemory_data.InMemoryBatches",
    "bench/bench_ingest.py: michelangelo.lib.trainer.torch.pytorch_lightning._ingest._inmemory_data.drain_shard",
    # DatasetIO's write and read, with its describe step timed by wrapping the module function.
    "bench/bench_dataset.py: michelangelo.workflow.variables._dataset_io",
    "bench/bench_dataset.py: michelangelo.workflow.variables._dataset_io.DatasetIO",
    # One KubeRay cluster's phases and one Jobs submission, without a workflow run around them.
    "bench/bench_kuberay.py: michelangelo.uniflow.plugins.ray._remote._jobs.JobsCluster",
    "bench/bench_kuberay.py: michelangelo.uniflow.plugins.ray.kuberay._provisioner.KubeRayCluster",
    # The cluster a task runs on, read inside the task to time its start.
    "bench/bench_cluster_start.py: michelangelo.uniflow.plugins.ray._capacity._train_check",
    # Packing the project for a remote run, timed apart from the submission.
    "bench/bench_remote.py: michelangelo.uniflow.plugins.ray._remote._working_dir.pack_project",
    "bench/bench_remote.py: michelangelo.uniflow.plugins.ray._remote._working_dir.project_root",
    # Serving's own HTTP client and app, for a Serve instance outside a run.
    "bench/bench_serving.py: michelangelo.lib.serving._client.post_json",
    "bench/bench_serving_rollout.py: michelangelo.lib.serving._app.build_app",
}


def test_benchmarks_import_only_public_names_but_the_listed_internals():
    found = {line.split(":", 1)[0] + ":" + line.split(":", 2)[2]
             for line in _private_in(ROOT, "bench")}
    unlisted = sorted(found - BENCH_INTERNALS)
    assert not unlisted, (
        "Benchmarks must use public names (or time an internal listed in BENCH_INTERNALS, "
        "with the reason):\n" + "\n".join(unlisted))
    assert not BENCH_INTERNALS - found, f"stale BENCH_INTERNALS: {sorted(BENCH_INTERNALS - found)}"


def test_no_import_cycle_between_packages():
    cycles = Tree(ROOT).cycles()
    assert not cycles, (
        "These packages import each other (directly or through others). Move the shared "
        "code to a package both use, or let the lower one offer a registry the higher one "
        "joins:\n" + "\n".join(" <-> ".join(group) for group in cycles))


def test_no_import_cycle_between_the_modules_of_a_package():
    cycles = Tree(ROOT).module_cycles()
    assert not cycles, (
        "The modules below import each other (directly or through others, deferred imports "
        "included). Move what both need to a module below them, or pass it in; a module "
        "imports a sibling directly, not through its package's __init__:\n"
        + "\n".join(cycles))


def test_the_architecture_page_names_every_package():
    section = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(p for p in Tree(ROOT).packages
                     if p != "michelangelo" and p.removeprefix("michelangelo.") not in section)
    assert not missing, f"docs/architecture.md does not name {missing}"


# The checks themselves, on a small tree that breaks both rules in the ways they must catch.

def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checks_catch_private_imports_and_cycles_in_a_bad_tree(tmp_path):
    _write(tmp_path, {
        "michelangelo/__init__.py": "",
        "michelangelo/a/__init__.py": "from michelangelo.b._impl import thing\n",
        "michelangelo/a/_x.py": "value = 1\n",
        "michelangelo/a/sub/__init__.py": "from michelangelo.a import _x\n",  # child -> parent
        "michelangelo/b/__init__.py": "from michelangelo.b._impl import thing\n",  # own: fine
        "michelangelo/b/_impl.py": """\
            thing = 1

            def later():
                from michelangelo.a import visible  # inside a function, still an edge
            """,
        "michelangelo/b/rel.py": "from ..a._x import value\n",
        "michelangelo/c/__init__.py": "from michelangelo.a import public_name\n",
    })
    tree = Tree(tmp_path)

    found = tree.private_imports()

    assert found == [
        "michelangelo/a/__init__.py:1: michelangelo.b._impl import thing",
        "michelangelo/a/sub/__init__.py:1: michelangelo.a._x",
        "michelangelo/b/rel.py:1: michelangelo.a._x import value",
    ]
    assert tree.cycles() == [["michelangelo.a", "michelangelo.b"]]
    _write(tmp_path, {"examples/demo.py": """\
        from michelangelo.a import public_name
        from michelangelo.b import _impl
        import michelangelo.a._x
        """})
    assert _private_in_examples(tmp_path) == [
        "examples/demo.py:2: michelangelo.b._impl",
        "examples/demo.py:3: michelangelo.a._x",
    ]
    _write(tmp_path, {"bench/bench_demo.py": """\
        def main():
            from michelangelo.a._x import value
            from michelangelo.c import public_name
        """})
    assert _private_in(tmp_path, "bench") == ["bench/bench_demo.py:2: michelangelo.a._x.value"]


def test_the_module_check_catches_cycles_within_a_package(tmp_path):
    _write(tmp_path, {
        "michelangelo/__init__.py": "",
        "michelangelo/a/__init__.py": "from michelangelo.a._x import run\nfrom . import _z\n",
        "michelangelo/a/_x.py": """\
            def run():
                from michelangelo.a._y import helper  # deferred, still an edge
            """,
        "michelangelo/a/_y.py": """\
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from michelangelo.a._x import run  # for the type checker only, still an edge
            """,
        "michelangelo/a/_z.py": "from michelangelo.a import run\n",  # the package's own face
        "michelangelo/a/face.py": "from michelangelo.a import run\n",  # not imported back: fine
        "michelangelo/a/sub/__init__.py": "from michelangelo.a import run\n",  # rule 2's
        "michelangelo/a/sub/_w.py": "from michelangelo.a.sub import thing\n",
        "michelangelo/b/__init__.py": "from michelangelo.a import run\n",
    })
    tree = Tree(tmp_path)

    assert tree.module_cycles() == [
        "michelangelo.a: __init__, _z",
        "michelangelo.a: _x, _y",
    ]
    assert tree.module_graph()["michelangelo.a.sub"] == set()
    assert tree.cycles() == []


def test_the_checks_pass_a_tree_that_keeps_the_rules(tmp_path):
    _write(tmp_path, {
        "michelangelo/__init__.py": "",
        "michelangelo/a/__init__.py": "from michelangelo.a._x import value\n",
        "michelangelo/a/_x.py": "import os\nvalue = 1\n",
        "michelangelo/b/__init__.py": "from michelangelo.a import value\n",
        "michelangelo/b/_impl.py": "def f():\n    from michelangelo.a import value\n",
    })
    tree = Tree(tmp_path)

    assert tree.private_imports() == []
    assert tree.cycles() == []
    assert tree.module_cycles() == []
    assert tree.graph()["michelangelo.b"] == {"michelangelo.a"}
    assert tree.module_graph()["michelangelo.a"] == {"michelangelo.a._x"}
