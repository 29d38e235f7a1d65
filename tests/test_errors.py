"""One exception root for the SDK: every error it raises on purpose, user or system side."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from michelangelo.errors import InputError, MichelangeloError, ServiceError
from michelangelo.lib.model_registry import (
    ModelRegistry,
    ModelRegistryError,
    RevisionNotFoundError,
    WeightsIntegrityError,
)
from michelangelo.lib.serving import DeploymentError, DeploymentNotFoundError, ServingError
from michelangelo.sandbox import SandboxError
from michelangelo.uniflow.core import RunNotFoundError, TaskTimeoutError, UserError
from michelangelo.uniflow.core.errors import ClusterError, RemoteTaskError
from michelangelo.uniflow.plugins.ray import CapacityError, ResourcesUnavailableError
from michelangelo.uniflow.report import build_report

USER_SIDE = [UserError, RunNotFoundError, CapacityError, ResourcesUnavailableError,
             RevisionNotFoundError, DeploymentNotFoundError]
SYSTEM_SIDE = [ClusterError, TaskTimeoutError, SandboxError, WeightsIntegrityError]
ROOTS_ONLY = [RemoteTaskError, ModelRegistryError, ServingError, DeploymentError]
# What each type was before the root came, and still is.
KEPT_BASES = {UserError: ValueError, CapacityError: ValueError, ModelRegistryError: ValueError,
              RevisionNotFoundError: LookupError, DeploymentNotFoundError: LookupError,
              SandboxError: RuntimeError, TaskTimeoutError: TimeoutError}


@pytest.mark.parametrize("kind", USER_SIDE + SYSTEM_SIDE + ROOTS_ONLY,
                         ids=lambda kind: kind.__name__)
def test_every_sdk_error_has_the_one_root_and_keeps_its_type_across_pickling(kind):
    error = kind("the message")
    assert isinstance(error, MichelangeloError)
    assert isinstance(error, InputError) == (kind in USER_SIDE)
    assert isinstance(error, ServiceError) == (kind in SYSTEM_SIDE)
    if kind in KEPT_BASES:
        assert isinstance(error, KEPT_BASES[kind])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is kind and str(copy) == "the message"


def test_kube_and_fit_errors_are_on_their_sides():
    from michelangelo.uniflow.plugins.ray.kuberay import ClusterFitError, KubeError

    refused = KubeError("forbidden", status=403, reason="Forbidden")
    assert isinstance(refused, ServiceError) and isinstance(refused, RuntimeError)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.status, copy.reason) == (403, "Forbidden")
    assert isinstance(ClusterFitError("too big"), InputError)


def test_one_except_catches_what_the_sdk_raises(tmp_path):
    with pytest.raises(InputError, match="nope"):
        build_report("nope")
    with pytest.raises(MichelangeloError) as caught:
        ModelRegistry(str(tmp_path / "registry")).get("proj/model:1")
    assert isinstance(caught.value, InputError)


@pytest.mark.parametrize("kind", USER_SIDE, ids=lambda kind: kind.__name__)
def test_every_input_error_is_a_value_error_as_the_guide_says(kind):
    assert issubclass(InputError, ValueError)
    with pytest.raises(ValueError):
        raise kind("bad value")


# Where product code raises a built-in on purpose, with the reason. Each entry is
# (path, enclosing function, why); the walk below fails on any bare
# ``raise ValueError/TypeError/RuntimeError`` elsewhere in michelangelo/.
BUILTIN_RAISE_ALLOWED = [
    ("michelangelo/lib/trainer/torch/pytorch_lightning/_strategies/_ray_lightning.py",
     "prepare_trainer",
     "it stands in for ray.train.lightning.prepare_trainer in hand-written Ray Train loops, "
     "whose contract is a RuntimeError; code written against Ray's catches that"),
]
BUILTINS = ("ValueError", "TypeError", "RuntimeError")
REPO = Path(__file__).resolve().parents[1]


def bare_builtin_raises(root: Path, package: str = "michelangelo") -> list[str]:
    """``path:line: raise Name in function`` for each bare built-in raise under root/package."""
    allowed = {(path, func) for path, func, _ in BUILTIN_RAISE_ALLOWED}
    found = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)

        def walk(node, func, rel=rel):
            for child in ast.iter_child_nodes(node):
                inner = func
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = child.name
                if isinstance(child, ast.Raise) and child.exc is not None:
                    target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                    if (isinstance(target, ast.Name) and target.id in BUILTINS
                            and (rel, func) not in allowed):
                        found.append(f"{rel}:{child.lineno}: raise {target.id} in {func}")
                walk(child, inner)

        walk(tree, "<module>")
    return found


def test_product_code_raises_the_sdks_own_types_not_bare_builtins():
    found = bare_builtin_raises(REPO)
    assert not found, (
        "bare built-in raises in product code (raise InputError / InputTypeError for bad "
        "input, a ServiceError for a failed service, InternalError for a broken invariant, "
        "from michelangelo.errors; or add the site to BUILTIN_RAISE_ALLOWED with its reason):\n"
        + "\n".join(found))


def test_the_allow_list_names_sites_that_exist_and_says_why():
    for path, func, why in BUILTIN_RAISE_ALLOWED:
        tree = ast.parse((REPO / path).read_text())
        assert func in {n.name for n in ast.walk(tree)
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}, (path, func)
        assert len(why.split()) >= 8, (path, func)


def test_the_raise_walk_catches_bare_builtins_in_a_bad_tree(tmp_path):
    package = tmp_path / "michelangelo"
    package.mkdir()
    (package / "bad.py").write_text(
        "def check(x):\n"
        "    if x < 0:\n"
        "        raise ValueError(f'x={x}')\n"
        "    if not x:\n"
        "        raise RuntimeError\n"
        "    raise TypeError('no')\n")
    (package / "good.py").write_text(
        "from michelangelo.errors import InputError\n"
        "def check(x):\n"
        "    try:\n"
        "        int(x)\n"
        "    except ValueError:\n"
        "        raise\n"
        "    raise InputError('x')\n")
    assert bare_builtin_raises(tmp_path) == [
        "michelangelo/bad.py:3: raise ValueError in check",
        "michelangelo/bad.py:5: raise RuntimeError in check",
        "michelangelo/bad.py:6: raise TypeError in check",
    ]


def test_the_wrong_kind_of_value_is_a_type_error_and_an_input_error():
    from michelangelo.errors import InputTypeError, InternalError
    from michelangelo.workflow.variables import DatasetVariable

    with pytest.raises(InputTypeError, match="builtins.list") as caught:
        DatasetVariable.create([1, 2])
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, InputError)
    assert issubclass(ServiceError, RuntimeError) and issubclass(InternalError, RuntimeError)
    assert not issubclass(InternalError, InputError | ServiceError)


def test_except_michelangelo_error_catches_a_bad_task_trainer_deploy_and_registry_call(tmp_path):
    from michelangelo.lib.serving import deploy
    from michelangelo.lib.trainer.torch.pytorch_lightning import LightningTrainerParam
    from michelangelo.uniflow.plugins.ray import RayTask

    def bad_calls():
        yield lambda: RayTask(head_cpu=-1)
        yield lambda: RayTask(head_memory="lots")
        yield lambda: LightningTrainerParam(create_model_fn=None, create_model_fn_kwargs={},
                                            train_data=None, val_data=None)
        yield lambda: LightningTrainerParam(create_model_fn=dict, create_model_fn_kwargs={},
                                            train_data=None, val_data=None, batch_size=0)
        yield lambda: deploy("proj/model@prod", registry=ModelRegistry(str(tmp_path / "r")))
        yield lambda: deploy("proj/model@prod", canary=1.5)
        yield lambda: ModelRegistry(str(tmp_path / "registry")).register(
            "Not A Project!", "model", state_dict={})

    for call in bad_calls():
        try:
            call()
        except MichelangeloError as error:  # the README's one except
            assert isinstance(error, InputError) and isinstance(error, ValueError), error
        else:
            pytest.fail("no error raised")
