"""``TransferLearningSpec`` inherit: copy named layers of a registered baseline into the model.

The names are matched on the driver against the baseline's stored names and shapes (read
from the safetensors header, not the weights) and the model built on the meta device, so a
pattern that matches nothing or a shape that differs fails before any worker starts. The
model's names are those it has when the factory returns it, or, when they do not fit, those
after ``configure_model()`` (layers created there); see ``_model_stages``. On the workers rank
0 reads the baseline once and broadcasts it; every rank copies the same tensors.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import (
    ModelSpec,
    align_state_dict_keys,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._model_stages import (
    BEFORE,
    MetaModels,
    first_stage_that_fits,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import (
    copy_into,
    read_on_rank0,
)

logger = logging.getLogger(__name__)

__all__ = ["InheritPlan", "apply_inherit", "inherit_mapping", "plan_inherit"]

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class InheritPlan:
    """What every worker copies, decided on the driver.

    Attributes:
        registry_url: Registry root the baseline lives in.
        baseline: The baseline revision, numbered (an alias is resolved once, on the driver,
            so every worker reads the same revision even if the alias moves meanwhile).
        mapping: ``(model name, baseline name)`` pairs to copy; None when the model could not
            be built on the meta device, in which case workers match the names themselves.
        loader: ``model_loader_function(model, baseline_state_dict)``, replacing the copy.
        spec: The user's spec (patterns, for matching on the workers).
        stage: When the copy happens on a worker (``_model_stages.BEFORE`` or ``AFTER``).
    """

    registry_url: str
    baseline: ModelSpec
    mapping: tuple[tuple[str, str], ...] | None
    loader: Callable[[Any, dict[str, Any]], Any] | None
    spec: TransferLearningSpec
    stage: str = BEFORE


def _matches(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def _pair_names(model_shapes: Shapes, baseline_shapes: Shapes) -> dict[str, str]:
    """Model name -> baseline name, lining up a leading prefix present on either side."""
    # The baseline may carry a prefix the model lacks (registered from a LightningModule,
    # inherited into its inner module), or lack one the model has (the reverse).
    stripped, _ = align_state_dict_keys({k: k for k in baseline_shapes}, model_shapes.keys())
    forward = {m: b for m, b in stripped.items() if m in model_shapes}
    stripped, _ = align_state_dict_keys({k: k for k in model_shapes}, baseline_shapes.keys())
    backward = {m: b for b, m in stripped.items() if b in baseline_shapes}
    return backward if len(backward) > len(forward) else forward


def inherit_mapping(model_shapes: Shapes, baseline_shapes: Shapes, spec: TransferLearningSpec,
                    baseline_name: str = "the baseline") -> list[tuple[str, str]]:
    """The ``(model name, baseline name)`` pairs ``spec`` inherits.

    Baseline names are first lined up with the model's (a baseline registered from the
    inner module of a LightningModule lacks its ``net.`` prefix, or the reverse). Without any
    pattern every name both sides share is inherited.

    Raises:
        ValueError: A name or pattern matches no layer present in both, nothing at all is
            shared, or a matched layer has a different shape on each side.
    """
    aligned = _pair_names(model_shapes, baseline_shapes)
    common = [name for name in model_shapes if name in aligned]
    if not spec.layer_names_to_inherit and not spec.layer_names_to_inherit_regex:
        if not common:
            raise InputError(
                f"TransferLearningSpec: {baseline_name} shares no layer name with the model "
                f"(baseline: {sorted(baseline_shapes)[:5]}, model: {list(model_shapes)[:5]}). "
                "Fix: register the baseline from the same kind of model, or set "
                "model_loader_function to map the names yourself.")
        selected = set(common)
    else:
        selected, unmatched = set(), []
        for layer in spec.layer_names_to_inherit:
            hits = [n for n in common if _matches(n, layer)]
            selected.update(hits)
            if not hits:
                unmatched.append(f"layer_names_to_inherit: {layer!r}")
        for pattern in spec.layer_names_to_inherit_regex:
            hits = [n for n in common if re.search(pattern, n)]
            selected.update(hits)
            if not hits:
                unmatched.append(f"layer_names_to_inherit_regex: {pattern!r}")
        if unmatched:
            raise InputError(
                f"TransferLearningSpec patterns match no layer that both the model and "
                f"{baseline_name} have: {unmatched}. Layers in both: {common[:8]}"
                f"{' ...' if len(common) > 8 else ''}. Fix: use those names (a module name "
                "inherits everything under it) or correct the regular expression.")
    pairs = [(name, aligned[name]) for name in model_shapes if name in selected]
    wrong = [f"{m}: model {list(model_shapes[m])} vs baseline {list(baseline_shapes[b])}"
             for m, b in pairs if tuple(model_shapes[m]) != tuple(baseline_shapes[b])]
    if wrong:
        raise InputError(
            f"TransferLearningSpec: inherited layers have different shapes in the model and "
            f"{baseline_name}: {wrong[:5]}. Fix: inherit only layers of the same shape (narrow "
            "layer_names_to_inherit) or build the model with the baseline's sizes.")
    return pairs


def _shapes(model: Any) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def plan_inherit(spec: TransferLearningSpec | None, models: MetaModels, registry: Any
                 ) -> InheritPlan | None:
    """Resolve the baseline and the names to copy, on the driver.

    Args:
        spec: The run's transfer learning spec.
        models: The model built on the meta device (before and after ``configure_model``).
        registry: The ``ModelRegistry`` to resolve the baseline in.

    Raises:
        ValueError: Inherit settings without a baseline, an unknown baseline, or names and
            shapes that do not fit (see :func:`inherit_mapping`).
    """
    if spec is None:
        return None
    wants = bool(spec.layer_names_to_inherit or spec.layer_names_to_inherit_regex
                 or spec.model_loader_function)
    baseline = spec.metadata.baseline_model if spec.metadata is not None else None
    if baseline is None:
        if wants:
            raise InputError(
                "TransferLearningSpec sets layer_names_to_inherit(_regex) or "
                "model_loader_function but no metadata.baseline_model to inherit from. Fix: "
                "TransferLearningSpec(metadata=TransferLearningMetadata(baseline_model="
                "ModelSpec('project', 'model', '@champion')), ...).")
        return None
    resolved = registry.resolve(baseline)
    name = f"baseline {resolved.project_name}/{resolved.model_name}:{resolved.revision_id}"
    mapping, stage = None, BEFORE
    if spec.model_loader_function is None:
        stored = registry.weights_shapes(resolved)
        fits = first_stage_that_fits(
            models, lambda model: tuple(inherit_mapping(_shapes(model), stored, spec, name)))
        if fits is not None:
            stage, mapping = fits
    logger.info("TransferLearningSpec: inheriting from %s (%s, %s)", name,
                "model_loader_function" if spec.model_loader_function else
                f"{len(mapping)} tensors" if mapping is not None else "names matched on workers",
                stage.replace("_", " "))
    return InheritPlan(registry.url, resolved, mapping, spec.model_loader_function, spec, stage)


def read_baseline(registry_url: str, baseline: ModelSpec, rank: int, world_size: int,
                  what: str) -> Any:
    """Read the baseline's weights on rank 0 (storage read once) and broadcast them."""
    from michelangelo.lib.model_registry import ModelRegistry

    status, value = read_on_rank0(
        lambda: ModelRegistry(registry_url).load_state_dict(baseline), rank, world_size)
    if status == "error":
        raise InputError(f"{what}: baseline {baseline.project_name}/{baseline.model_name}:"
                         f"{baseline.revision_id} could not be read on rank 0: {value}")
    return value


def worker_mapping(model: Any, plan: InheritPlan, weights: Mapping[str, Any]
                   ) -> tuple[tuple[str, str], ...]:
    """The pairs to copy into ``model`` now: the driver's, or matched here when it had none."""
    if plan.mapping is not None:
        return plan.mapping
    return tuple(inherit_mapping(_shapes(model), {k: tuple(v.shape) for k, v in weights.items()},
                                 plan.spec))


def apply_inherit(model: Any, plan: InheritPlan | None, rank: int, world_size: int,
                  weights: Mapping[str, Any] | None = None) -> None:
    """Copy the planned baseline tensors into ``model`` (every rank, in place).

    ``weights`` is the baseline's state dict when the caller already read it.
    """
    if plan is None:
        return
    import torch

    if weights is None:
        weights = read_baseline(plan.registry_url, plan.baseline, rank, world_size,
                                "TransferLearningSpec")
    if plan.loader is not None:
        plan.loader(model, weights)
        return
    own = model.state_dict()
    mapping = worker_mapping(model, plan, weights)
    with torch.no_grad():
        for model_name, baseline_name in mapping:
            copy_into(own[model_name], weights[baseline_name])
    if rank == 0:
        logger.info("Inherited %d tensors from %s/%s:%s", len(mapping),
                    plan.baseline.project_name, plan.baseline.model_name,
                    plan.baseline.revision_id)
