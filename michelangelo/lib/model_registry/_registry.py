"""``ModelRegistry``: register, find, load and alias model revisions on any fsspec storage."""

from __future__ import annotations

import builtins
import json
import logging
import os
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import (
    ModelSpec,
    align_state_dict_keys,
)
from michelangelo.lib.model_registry import _safetensors as st
from michelangelo.lib.model_registry._convert import TrainingState, read_checkpoint
from michelangelo.lib.model_registry._errors import (
    ModelRegistryError,
    RevisionNotFoundError,
    WeightsIntegrityError,
)
from michelangelo.lib.model_registry._factory import factory_reference, resolve_factory
from michelangelo.lib.model_registry._lineage import (
    clean_metrics,
    collect_lineage,
    package_versions,
    user_name,
)
from michelangelo.lib.model_registry._optimizer_state import join_states, split_states
from michelangelo.lib.model_registry._revision import Revision
from michelangelo.lib.model_registry._signature import example_and_signature
from michelangelo.lib.model_registry._spec import check_alias, check_name, parse_model_spec
from michelangelo.lib.model_registry._store import (
    OPTIMIZER_FILE,
    OPTIMIZER_JSON,
    REVISION_FILE,
    WEIGHTS_FILE,
    ModelStore,
)
from michelangelo.lib.model_registry._tokenizer import (
    TextTokenizer,
    check_processing,
    decode_tokenizer,
    encode_tokenizer,
)

logger = logging.getLogger(__name__)

__all__ = ["ENV_REGISTRY_URL", "ModelRegistry", "registry_url"]

#: Environment variable naming the registry root (any fsspec URL).
ENV_REGISTRY_URL = "MA_MODEL_REGISTRY_URL"


def registry_url(root: str | None = None) -> str:
    """The registry root: ``root``, else ``$MA_MODEL_REGISTRY_URL``, else uniflow storage's
    ``model_registry`` folder (``$UF_STORAGE_URL`` or ``~/.michelangelo/uniflow``)."""
    from michelangelo.uniflow.core.plugin import storage_url

    url = root or os.environ.get(ENV_REGISTRY_URL) or f"{storage_url()}/model_registry"
    if "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/")


def _scheduler_skeleton(states: builtins.list[dict[str, Any]],
                        tensors: dict[str, torch.Tensor]) -> builtins.list[Any] | None:
    """The LR schedulers' states for the optimizer file, or None when one cannot be stored.

    A scheduler whose state holds a Python object (a callable, say) cannot be kept without a
    pickle; the optimizer state still is, and a continued run starts that schedule afresh.
    """
    try:
        extra: dict[str, torch.Tensor] = {}
        _, skeleton = split_states(states, "sched", extra)
    except ValueError as error:
        logger.warning("keep_optimizer_state: LR scheduler state is not kept (%s); an "
                       "incremental run restarts the schedule.", str(error).split(". Fix")[0])
        return None
    tensors.update(extra)
    return skeleton


class ModelRegistry:
    """Versioned model revisions with lineage, integrity checks and aliases.

    Every revision is a folder of safetensors weights and JSON metadata under
    ``<root>/<project>/<model>/revisions/<n>``; nothing is pickled. Revision numbers are
    claimed with an exclusive create, so concurrent registrations from many processes get
    distinct numbers, and a registration becomes visible only once complete.

    Args:
        root: Any fsspec URL or local folder. Default: ``$MA_MODEL_REGISTRY_URL``, else
            ``<$UF_STORAGE_URL or ~/.michelangelo/uniflow>/model_registry``.
    """

    def __init__(self, root: str | None = None) -> None:
        self.url = registry_url(root)
        self._store = ModelStore(self.url)

    def __repr__(self) -> str:
        return f"ModelRegistry({self.url!r})"

    # ---- register ------------------------------------------------------------------------

    def register(
        self,
        project_name: str,
        model_name: str,
        *,
        checkpoint_path: Any = None,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        model: torch.nn.Module | None = None,
        create_model_fn: Callable[..., Any] | None = None,
        create_model_fn_kwargs: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        description: str | None = None,
        tags: Mapping[str, str] | None = None,
        input_example: Any = None,
        keep_optimizer_state: bool = False,
        train_result: Mapping[str, Any] | None = None,
        datasets: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        allow_non_finite: bool | Sequence[str] = False,
        tokenizer: Any = None,
        processing: Mapping[str, Any] | None = None,
    ) -> ModelSpec:
        """Store a new revision of ``project_name/model_name`` and return its spec.

        Exactly one weights source: ``checkpoint_path`` (any checkpoint the trainer writes:
        ddp file, FSDP2 or FSDP sharded DCP folder, DeepSpeed ZeRO folder; local or URL),
        ``state_dict``, ``model``, or ``train_result`` (what ``LightningTrainer.train()``
        returns: its checkpoint, run path and metrics are used).

        Args:
            project_name: Registry project.
            model_name: Model inside the project.
            checkpoint_path: A trainer checkpoint.
            state_dict: Names to tensors.
            model: A module whose ``state_dict()`` is stored; also used to run
                ``input_example``.
            create_model_fn: Top-level function or class that rebuilds the model; stored by
                module and qualified name (a script run as ``__main__`` by its path).
            create_model_fn_kwargs: Its keyword arguments (JSON values).
            metrics: Final metrics (numbers or strings). Default: ``train_result["metrics"]``.
            description: Free text.
            tags: String key/value pairs.
            input_example: A small batch (tensor, array, or dict of them for ``model(**x)``);
                the model's outputs for it and the OIP signature are stored with it.
            keep_optimizer_state: Also keep the optimizer state and loop position of a
                single-file checkpoint, for ``IncrementalTrainingSpec(load_optimizer_weights=True)``.
            train_result: ``LightningTrainer.train()``'s result (lineage, default metrics,
                and the checkpoint when no other source is given).
            datasets: Name to ``DatasetVariable`` (or fingerprint) the model was trained on.
            lineage: Extra lineage key/values (scalars).
            allow_non_finite: Inputs (names, or ``True`` for all) whose NaN and infinities
                the model handles; serving refuses them in every other input. Recorded in
                the signature, so it needs ``input_example``.
            tokenizer: Stored with the revision as data, never pickled: a
                ``tokenizers.Tokenizer`` (as its ``tokenizer.json``) or a
                :class:`CharacterTokenizer` (its vocabulary). Read back with
                :meth:`load_tokenizer`.
            processing: How serving turns text into the model's input and back, e.g.
                ``{"task": "text-generation", "max_tokens": 48, "max_context": 64}``: the
                model then takes token ids ``[batch, length]`` and returns logits
                ``[batch, length, vocab]``, and the endpoint takes and returns text. Needs
                ``tokenizer`` and ``input_example`` (a batch of token ids).

        Returns:
            ``ModelSpec(project_name, model_name, revision_id)`` of the new revision.

        Raises:
            ValueError: Bad arguments (named in the message), all checked before anything is
                written.
        """
        check_name("project_name", project_name)
        check_name("model_name", model_name)
        if train_result is not None and not isinstance(train_result, Mapping):
            raise InputError(f"train_result must be the dict LightningTrainer.train() returns, "
                             f"got {type(train_result).__name__}.")
        if checkpoint_path is None and train_result is not None and state_dict is None \
                and model is None:
            checkpoint_path = train_result.get("checkpoint_path")
            if checkpoint_path is None:
                raise InputError("train_result has no checkpoint_path (the run saved no "
                                 "checkpoint). Fix: pass state_dict= or model= instead.")
        given = [n for n, v in (("checkpoint_path", checkpoint_path), ("state_dict", state_dict),
                                ("model", model)) if v is not None]
        if len(given) != 1:
            raise InputError(f"register() needs exactly one weights source, got {given or 'none'}."
                             " Fix: pass one of checkpoint_path=, state_dict= or model=.")
        if keep_optimizer_state and checkpoint_path is None:
            raise InputError("keep_optimizer_state=True needs checkpoint_path= (or train_result=):"
                             " only a training checkpoint holds optimizer state.")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        if state_dict is not None and not isinstance(state_dict, Mapping):
            raise InputError(f"state_dict must be a dict of tensors, got "
                             f"{type(state_dict).__name__}.")
        if allow_non_finite and input_example is None:
            raise InputError("allow_non_finite needs input_example=: it is recorded in the "
                             "signature the example produces.")
        if input_example is not None and model is None and create_model_fn is None:
            raise InputError("input_example needs a model to run it: pass model= or "
                             "create_model_fn=.")
        stored_tokenizer = None if tokenizer is None else encode_tokenizer(tokenizer)
        process_spec = None
        if processing is not None:
            if stored_tokenizer is None or input_example is None:
                raise InputError("processing needs tokenizer= and input_example= (a batch of "
                                 "token ids): serving turns text into ids with the tokenizer "
                                 "and proves the model with the example.")
            process_spec = check_processing(processing, decode_tokenizer(
                stored_tokenizer[0], stored_tokenizer[2]).vocab_size)
        factory = ({} if create_model_fn is None
                   else factory_reference(create_model_fn, create_model_fn_kwargs))
        if create_model_fn is None and create_model_fn_kwargs:
            raise InputError("create_model_fn_kwargs was given without create_model_fn.")
        tag_map = self._check_tags(tags)
        if description is not None and not isinstance(description, str):
            raise InputError(f"description must be a string, got {description!r}.")
        metric_map = clean_metrics(metrics if metrics is not None else
                                   (train_result or {}).get("metrics"))

        training: TrainingState | None = None
        source_format = None
        if checkpoint_path is not None:
            weights, training, source_format = read_checkpoint(checkpoint_path,
                                                               keep_optimizer_state)
        elif model is not None:
            weights = model.state_dict()
        else:
            weights = dict(state_dict)
        if factory:
            self._check_factory_keys(create_model_fn, factory["kwargs"], weights)

        example = signature = None
        if input_example is not None:
            runner = model if model is not None else self._build(create_model_fn,
                                                                 factory["kwargs"], weights)
            example, signature = example_and_signature(runner, input_example,
                                                       allow_non_finite=allow_non_finite)

        lineage_map = collect_lineage(
            source="checkpoint" if checkpoint_path is not None else
            ("model" if model is not None else "state_dict"),
            checkpoint=_describe_source(checkpoint_path),
            train_result=train_result, datasets=datasets, extra=lineage)
        if source_format:
            lineage_map["checkpoint_format"] = source_format
        return self._write(project_name, model_name, weights, training, {
            "created_at": time.time(), "metrics": metric_map, "description": description,
            "tags": tag_map, "factory": factory, "lineage": lineage_map,
            "versions": package_versions(), "signature": signature or {},
            "input_example": example, "num_tensors": len(weights), "created_by": user_name(),
            "processing": process_spec,
        }, tokenizer=stored_tokenizer)

    @staticmethod
    def _check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
        out = {}
        for key, value in (tags or {}).items():
            if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
                raise InputError(f"tags[{key!r}]={value!r}: tags are string keys with string "
                                 "values. Fix: str() the value.")
            out[key] = str(value)
        return out

    @staticmethod
    def _check_factory_keys(fn: Callable[..., Any], kwargs: dict[str, Any],
                            weights: Mapping[str, Any]) -> None:
        # Building on the meta device costs no memory; a factory whose model shares no key
        # with the weights is a mistake best caught now, not when serving starts.
        try:
            with torch.device("meta"):
                built = fn(**kwargs)
            keys = built.state_dict().keys()
        except Exception as error:  # noqa: BLE001 - some factories cannot build on meta
            logger.debug("factory key check skipped: %s", error)
            return
        aligned, _ = align_state_dict_keys(weights, keys)
        if weights and not set(aligned) & set(keys):
            raise InputError(
                f"create_model_fn's model shares no parameter name with the weights (model: "
                f"{sorted(keys)[:4]}, weights: {sorted(weights)[:4]}). Fix: pass the factory "
                "of the model these weights belong to.")

    @staticmethod
    def _build(fn: Callable[..., Any], kwargs: Mapping[str, Any],
               weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        built = fn(**kwargs)
        aligned, _ = align_state_dict_keys(weights, built.state_dict().keys())
        built.load_state_dict(aligned, strict=False)
        return built

    def _write(self, project: str, model: str, weights: Mapping[str, torch.Tensor],
               training: TrainingState | None, metadata: dict[str, Any],
               tokenizer: tuple[str, str, bytes] | None = None) -> ModelSpec:
        store = self._store
        staging = store.new_staging(project, model)
        try:
            if tokenizer is not None:
                kind, name, data = tokenizer
                store.write(posixpath.join(staging, name), data)
                metadata["tokenizer"] = {"kind": kind, "file": name, "bytes": len(data),
                                         "sha256": st.sha256_of(data)}
            with store.open_write(posixpath.join(staging, WEIGHTS_FILE)) as handle:
                size, digest = st.write_state_dict(handle, weights)
            metadata["weights_sha256"] = digest
            metadata["weights_bytes"] = size
            if training is not None:
                tensors, skeleton = split_states(training.optimizer_states)
                schedulers = _scheduler_skeleton(training.lr_scheduler_states, tensors)
                blob = st.encode(tensors, "optimizer state")
                store.write(posixpath.join(staging, OPTIMIZER_FILE), blob)
                store.write(posixpath.join(staging, OPTIMIZER_JSON), json.dumps(
                    {"optimizers": skeleton, "lr_schedulers": schedulers}).encode())
                metadata["optimizer_state"] = {
                    "sha256": st.sha256_of(blob), "bytes": len(blob),
                    "num_optimizers": len(skeleton), "epoch": training.epoch,
                    "global_step": training.global_step,
                    "num_lr_schedulers": None if schedulers is None else len(schedulers)}
            revision = store.claim_revision(project, model)
            record = Revision(project_name=project, model_name=model, revision_id=revision,
                              **metadata).to_dict()
            record.pop("aliases")
            store.publish(staging, project, model, revision, record)
        except BaseException:
            store.discard(staging)
            raise
        logger.info("Registered %s/%s:%d (%d bytes of weights) in %s", project, model, revision,
                    metadata["weights_bytes"], self.url)
        _record_in_run(project, model, revision, metadata, self.url)
        return ModelSpec(project, model, revision)

    # ---- read ----------------------------------------------------------------------------

    def _aliases(self, project: str, model: str) -> dict[str, int]:
        current: dict[str, int] = {}
        for event in self._store.alias_events(project, model):
            if event.get("to") is None:
                current.pop(event["alias"], None)
            else:
                current[event["alias"]] = int(event["to"])
        return current

    def resolve(self, spec: str | ModelSpec) -> ModelSpec:
        """The numbered spec that ``spec`` (latest, ``:n`` or ``@alias``) points at now.

        Raises:
            RevisionNotFoundError: No such model, revision or alias.
        """
        parsed = parse_model_spec(spec)
        project, model, revision = parsed.project_name, parsed.model_name, parsed.revision_id
        published = self._store.revisions(project, model)
        name = f"{project}/{model}"
        if not published and revision is None:
            known = self._store.models(project)
            raise RevisionNotFoundError(
                f"model {name!r} has no revisions in {self.url!r} (models in project "
                f"{project!r}: {known}). Fix: register it first, or check the names.")
        if isinstance(revision, str):
            aliases = self._aliases(project, model)
            alias = revision[1:]
            if alias not in aliases:
                raise RevisionNotFoundError(
                    f"model {name!r} has no alias {alias!r} (aliases: {sorted(aliases)}). "
                    f"Fix: set it with set_alias({project!r}, {model!r}, {alias!r}, REVISION).")
            revision = aliases[alias]
        elif revision is None:
            revision = published[-1]
        if revision not in published:
            raise RevisionNotFoundError(
                f"model {name!r} has no revision {revision} (revisions: {published}). Fix: pick "
                "one of those.")
        return ModelSpec(project, model, revision)

    def _read_revision(self, spec: ModelSpec, aliases: dict[str, int] | None = None) -> Revision:
        assert isinstance(spec.revision_id, int)
        path = self._store.file(spec.project_name, spec.model_name, spec.revision_id,
                                REVISION_FILE)
        data = self._store.storage.try_read_json(path)
        if data is None:
            raise RevisionNotFoundError(f"revision {spec.project_name}/{spec.model_name}:"
                                        f"{spec.revision_id} was deleted while being read.")
        if aliases is None:
            aliases = self._aliases(spec.project_name, spec.model_name)
        revision = Revision.from_dict(data)
        return revision.with_aliases([a for a, n in aliases.items() if n == spec.revision_id])

    def get(self, spec: str | ModelSpec) -> Revision:
        """Metadata of one revision (``revision_id=None`` means the latest).

        Args:
            spec: ``ModelSpec`` or ``"project/model"``, ``"project/model:3"``,
                ``"project/model@champion"``.

        Raises:
            RevisionNotFoundError: No such model, revision or alias.
        """
        return self._read_revision(self.resolve(spec))

    def list(self, project_name: str, model_name: str | None = None) -> builtins.list[Revision]:
        """Revisions of one model, or of every model in a project; newest last."""
        check_name("project_name", project_name)
        models = ([check_name("model_name", model_name)] if model_name is not None
                  else self._store.models(project_name))
        out: builtins.list[Revision] = []
        for model in models:
            aliases = self._aliases(project_name, model)
            for number in self._store.revisions(project_name, model):
                try:
                    out.append(self._read_revision(ModelSpec(project_name, model, number),
                                                   aliases))
                except RevisionNotFoundError:  # deleted meanwhile
                    continue
        return sorted(out, key=lambda r: (r.created_at, r.model_name, r.revision_id))

    def projects(self) -> builtins.list[str]:
        """Project names that hold at least one model folder."""
        return self._store.projects()

    def _read_small(self, revision: Revision, name: str) -> bytes:
        path = self._store.file(revision.project_name, revision.model_name,
                                revision.revision_id, name)
        try:
            return self._store.storage.read_bytes(path)
        except FileNotFoundError:
            raise WeightsIntegrityError(f"revision {revision.name} is missing its {name}. Fix: "
                                        "re-register the model.") from None

    def load_tokenizer(self, spec: str | ModelSpec) -> TextTokenizer:
        """The tokenizer stored with the revision (sha256 verified).

        Returns:
            A :class:`TextTokenizer`: ``encode(text) -> ids`` and ``decode(ids) -> text``,
            whatever kind was stored (``.inner`` is the stored object).

        Raises:
            RevisionNotFoundError: No such revision.
            ModelRegistryError: The revision carries no tokenizer.
            WeightsIntegrityError: The stored file does not match its recorded sha256.
        """
        revision = self.get(spec)
        record = revision.tokenizer
        if not record:
            raise ModelRegistryError(f"revision {revision.name} carries no tokenizer. Fix: "
                                     "register it with tokenizer=...")
        data = self._read_small(revision, record["file"])
        _verify(revision, st.sha256_of(data), record["sha256"], record["file"])
        return decode_tokenizer(record["kind"], data)

    def load_state_dict(self, spec: str | ModelSpec) -> dict[str, torch.Tensor]:
        """The revision's weights as CPU tensors (tied names tied again), sha256 verified.

        Raises:
            RevisionNotFoundError: No such revision.
            WeightsIntegrityError: The stored file does not match its recorded sha256.
        """
        revision = self.get(spec)
        path = self._store.file(revision.project_name, revision.model_name,
                                revision.revision_id, WEIGHTS_FILE)
        try:
            size = self._store.size(path)
            if size != revision.weights_bytes:
                raise InputError(f"{size} bytes, recorded {revision.weights_bytes}")
            local = self._store.local_path(path)
            if local is not None:
                weights, digest = st.map_state_dict(local, size)
            else:
                with self._store.open_read(path) as handle:
                    weights, digest = st.read_state_dict(handle, size)
        except (OSError, ValueError) as error:
            raise WeightsIntegrityError(
                f"revision {revision.name}: {WEIGHTS_FILE} is unreadable or truncated ({error})."
                " Fix: re-register the model; do not serve this revision.") from None
        _verify(revision, digest, revision.weights_sha256, WEIGHTS_FILE)
        return weights

    def load_training_state(self, spec: str | ModelSpec) -> TrainingState:
        """The optimizer states and loop position kept with ``keep_optimizer_state=True``.

        Raises:
            ValueError: The revision kept no optimizer state.
            WeightsIntegrityError: The stored file does not match its recorded sha256.
        """
        revision = self.get(spec)
        info = revision.optimizer_state
        if not info:
            raise ModelRegistryError(
                f"revision {revision.name} kept no optimizer state. Fix: register it from the "
                "run's checkpoint with keep_optimizer_state=True, or set "
                "load_optimizer_weights=False.")
        blob = self._read_small(revision, OPTIMIZER_FILE)
        _verify(revision, st.sha256_of(blob), info["sha256"], OPTIMIZER_FILE)
        skeleton = json.loads(self._read_small(revision, OPTIMIZER_JSON))
        if isinstance(skeleton, list):  # written before scheduler states were kept
            skeleton = {"optimizers": skeleton, "lr_schedulers": None}
        tensors = st.decode(bytearray(blob))
        schedulers = skeleton.get("lr_schedulers")
        return TrainingState(
            join_states(tensors, skeleton["optimizers"]), int(info["epoch"]),
            int(info["global_step"]),
            None if schedulers is None else join_states(tensors, schedulers))

    def weights_shapes(self, spec: str | ModelSpec) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the revision's weights, read from the file's header only."""
        revision = self.get(spec)
        path = self._store.file(revision.project_name, revision.model_name,
                                revision.revision_id, WEIGHTS_FILE)
        with self._store.storage.fs.open(path, "rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little")
            header = st.read_header(head + handle.read(length))
        return st.shapes_of(header)

    def load_model(self, spec: str | ModelSpec,
                   create_model_fn: Callable[..., Any] | None = None) -> torch.nn.Module:
        """Build the model with the recorded factory, load the weights, return it in eval mode.

        Args:
            spec: The revision.
            create_model_fn: Overrides the recorded factory (called with the recorded kwargs).

        Raises:
            ValueError: No factory, the factory cannot be imported, or the weights do not fit
                the model (missing or unexpected names are listed).
        """
        revision = self.get(spec)
        fn = create_model_fn or resolve_factory(revision.factory)
        built = fn(**(revision.factory or {}).get("kwargs", {}))
        if not isinstance(built, torch.nn.Module):
            raise InputError(f"the factory of {revision.name} returned a {type(built).__name__}, "
                             "not a torch.nn.Module.")
        weights = self.load_state_dict(revision.spec)
        aligned, _ = align_state_dict_keys(weights, built.state_dict().keys())
        result = built.load_state_dict(aligned, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise InputError(
                f"the weights of {revision.name} do not fit the model its factory builds: "
                f"missing {list(result.missing_keys)[:8]}, unexpected "
                f"{list(result.unexpected_keys)[:8]}. Fix: pass the matching create_model_fn.")
        return built.eval()

    # ---- change --------------------------------------------------------------------------

    def delete(self, spec: str | ModelSpec) -> None:
        """Delete one revision; its number is never reused.

        Raises:
            RevisionNotFoundError: No such revision.
            ValueError: An alias still points at it (move or remove the alias first).
        """
        target = self.resolve(spec)
        pointing = [a for a, n in self._aliases(target.project_name, target.model_name).items()
                    if n == target.revision_id]
        if pointing:
            raise ModelRegistryError(
                f"revision {target.project_name}/{target.model_name}:{target.revision_id} is "
                f"still the target of alias(es) {pointing}. Fix: move them with set_alias() or "
                "remove them with remove_alias() first.")
        assert isinstance(target.revision_id, int)
        self._store.delete_revision(target.project_name, target.model_name, target.revision_id)

    def set_alias(self, project_name: str, model_name: str, alias: str,
                  revision_id: int | str) -> None:
        """Point ``alias`` at ``revision_id``; the move is kept in :meth:`alias_history`.

        Raises:
            RevisionNotFoundError: The revision does not exist.
            ValueError: Invalid alias name.
        """
        alias = check_alias(alias)
        if isinstance(revision_id, bool) or not isinstance(revision_id, int | str):
            raise InputError(f"revision_id={revision_id!r} must be a revision number.")
        target = self.resolve(ModelSpec(project_name, model_name, revision_id))
        self._store.append_alias_event(project_name, model_name, {
            "alias": alias, "to": target.revision_id, "who": user_name(), "when": time.time()})

    def remove_alias(self, project_name: str, model_name: str, alias: str) -> None:
        """Remove ``alias`` (recorded in the history as a move to nothing).

        Raises:
            RevisionNotFoundError: The alias is not set.
        """
        alias = check_alias(alias)
        if alias not in self._aliases(project_name, model_name):
            raise RevisionNotFoundError(f"model {project_name}/{model_name} has no alias "
                                        f"{alias!r}.")
        self._store.append_alias_event(project_name, model_name, {
            "alias": alias, "to": None, "who": user_name(), "when": time.time()})

    def alias_history(self, project_name: str, model_name: str) -> builtins.list[dict[str, Any]]:
        """Every alias move, oldest first: ``{"alias", "from", "to", "who", "when"}``.

        ``from`` is the revision the alias pointed at before the move (None when it was new),
        ``to`` the revision after (None when it was removed).
        """
        check_name("project_name", project_name)
        check_name("model_name", model_name)
        current: dict[str, int | None] = {}
        history = []
        for event in self._store.alias_events(project_name, model_name):
            alias = event["alias"]
            history.append({"alias": alias, "from": current.get(alias), "to": event.get("to"),
                            "who": event.get("who"), "when": event.get("when")})
            current[alias] = event.get("to")
        return history


def _verify(revision: Revision, actual: str, expected: str, name: str) -> None:
    if actual != expected:
        raise WeightsIntegrityError(
            f"revision {revision.name}: {name} is corrupted (sha256 {actual[:16]}..., recorded "
            f"{expected[:16]}...). Fix: re-register the model; do not serve this revision.")


def _describe_source(source: Any) -> str | None:
    if source is None:
        return None
    path = getattr(source, "path", None)
    filesystem = getattr(source, "filesystem", None)
    if path is not None and filesystem is not None:  # a ray.train.Checkpoint
        return str(path)
    return os.fspath(source) if isinstance(source, str | os.PathLike) else str(source)


def _record_in_run(project: str, model: str, revision: int, metadata: dict[str, Any],
                   url: str) -> None:
    """Note the new revision in the running uniflow task's record (for ``runs report``)."""
    from michelangelo.uniflow.core import record_artifact

    record_artifact("registry_revision", spec=f"{project}/{model}:{revision}",
                    weights_bytes=metadata.get("weights_bytes"),
                    metrics=metadata.get("metrics") or {}, registry=str(url))
