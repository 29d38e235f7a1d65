"""GPT fine-tuning with LoRA: pretrain -> register -> fine-tune (FSDP2) -> register -> deploy.

Run it with ``python examples/gpt_lora/workflow.py`` (``--size tiny|default|gpu``,
``--strategy fsdp2|ddp``). Everything ships with the example, nothing is downloaded:

1. ``pretrain``: a small GPT-2 style causal language model, built from a config in code
   (``transformers.GPT2Config``), learns characters from ``data/pretrain.txt`` on two Ray
   Train workers through ``LightningTrainer``; the result is registered as ``gpt-base``.
2. ``finetune``: a fresh model inherits every weight of that registered revision through
   ``TransferLearningSpec`` (``baseline_model`` = the base revision), ``peft`` adds LoRA
   adapters in ``configure_model()`` and FSDP2 shards it; only the adapters train, on
   ``data/finetune.txt`` (a lighthouse keeper's log). AdamW with warmup + cosine decay per
   step, gradient clipping by norm, bf16-mixed on GPUs that support it. The adapters are
   merged into the weights and the result is registered as ``gpt-keeper``.
3. ``serve``: ``gpt-keeper`` is deployed on Ray Serve. The endpoint takes text and answers
   text: the Open Inference Protocol's ``generate`` (greedy by default) and
   ``generate_stream`` (server-sent events, one per character), which the example calls
   and prints with ``curl`` lines to try.

The vocabulary is the set of characters in the shipped text. Each revision carries it as
its tokenizer (``CharacterTokenizer``, stored as ``vocab.json``) with a text-generation
spec, so the endpoint turns text into token ids and back from the registry alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
from typing import Any

import numpy as np
import pytorch_lightning as pl
import ray.data
import torch
from ray.train import CheckpointConfig, ScalingConfig
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

import michelangelo.uniflow.core as uniflow
from michelangelo.lib.model_registry import CharacterTokenizer, ModelRegistry, parse_model_spec
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LearningMode,
    LightningTrainerParam,
    LightningTrainerWithStateDict,
    TransferLearningMetadata,
    TransferLearningSpec,
)
from michelangelo.uniflow.plugins.ray import RayTask, create_run_config

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = "examples"
BASE_MODEL = "gpt-base"
TUNED_MODEL = "gpt-keeper"
STRATEGIES = ("fsdp2", "ddp")
PROMPTS = ("The keeper wrote: ", "The keeper wrote: fog in the ")
SEED = 0  # for Lightning's seed_everything on each Ray Train worker

# Each size: model shape, data windows, epochs, per-worker batch, workers, and its cluster.
# "tiny" is for tests, "default" fits a 2-core laptop in a few minutes, "gpu" is for a
# machine with CUDA (one GPU per Ray Train worker).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"n_embd": 32, "n_layer": 2, "n_head": 2, "block_size": 32, "stride": 2,
             "pretrain_epochs": 2, "finetune_epochs": 3, "batch_size": 32, "workers": 2,
             "learning_rate": 1e-2, "finetune_learning_rate": 3e-2, "lora_rank": 4,
             "new_tokens": 24},
    "default": {"n_embd": 96, "n_layer": 3, "n_head": 4, "block_size": 64, "stride": 2,
                "pretrain_epochs": 4, "finetune_epochs": 4, "batch_size": 32, "workers": 2,
                "learning_rate": 3e-3, "finetune_learning_rate": 5e-3, "lora_rank": 8,
                "new_tokens": 48},
    "gpu": {"n_embd": 384, "n_layer": 6, "n_head": 6, "block_size": 128, "stride": 1,
            "pretrain_epochs": 6, "finetune_epochs": 6, "batch_size": 64, "workers": 1,
            "learning_rate": 1e-3, "finetune_learning_rate": 2e-3, "lora_rank": 16,
            "new_tokens": 64},
}
ARCH_KEYS = ("n_embd", "n_layer", "n_head", "block_size")

# One node on a laptop (the fewest Ray processes): two Ray Train workers of 1 CPU and 2 GiB,
# a CPU for Ray Data and room for the Serve replica.
CPU_CLUSTER = RayTask(head_cpu=4, head_memory="8Gi")
# To scale out: more GPU nodes (worker_instances) and ScalingConfig(num_workers=...) to match.
GPU_CLUSTER = RayTask(head_cpu=2, head_memory="8Gi", worker_cpu=4, worker_memory="32Gi",
                      worker_gpu=1, worker_instances=1)


# --- text and tokens --------------------------------------------------------------------------

def read_text(name: str) -> str:
    """One of the texts that ship in ``data/``."""
    with open(os.path.join(HERE, "data", name), encoding="utf-8") as handle:
        return handle.read()


def build_vocab() -> str:
    """Every character of the shipped texts, sorted: index = token id."""
    return "".join(sorted(set(read_text("pretrain.txt")) | set(read_text("finetune.txt"))))


def text_windows(text: str, tokenizer: CharacterTokenizer, block_size: int, stride: int,
                 val_fraction: float = 0.15) -> tuple[list[dict], list[dict]]:
    """Overlapping windows of ``block_size + 1`` ids; the tail of the text is validation."""
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    cut = int(len(ids) * (1 - val_fraction))

    def windows(part: np.ndarray, step: int) -> list[dict]:
        return [{"ids": part[i:i + block_size + 1]}
                for i in range(0, len(part) - block_size - 1, step)]

    return windows(ids[:cut], stride), windows(ids[cut:], max(stride, block_size // 4))


# --- model ------------------------------------------------------------------------------------

def build_gpt(vocab: str, n_embd: int, n_layer: int, n_head: int, block_size: int) -> nn.Module:
    """A GPT-2 architecture from a config written here: nothing is downloaded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(vocab), n_positions=block_size, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, use_cache=False)
    return GPT2LMHeadModel(config)


class CausalLMForServing(nn.Module):
    """What the endpoint serves: token ids ``[batch, length]`` in, logits out.

    The endpoint does the rest from what the revision carries: it tokenizes the prompt with
    the stored vocabulary, decodes one token at a time (up to ``block_size`` of context) and
    answers text.

    Args:
        vocab: The characters, in token-id order.
        n_embd, n_layer, n_head, block_size: The GPT-2 shape.
    """

    def __init__(self, vocab: str, n_embd: int, n_layer: int, n_head: int,
                 block_size: int) -> None:
        super().__init__()
        self.lm = build_gpt(vocab, n_embd, n_layer, n_head, block_size)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.lm(input_ids=input_ids.long()).logits}


def create_causal_lm(**kwargs: Any) -> CausalLMForServing:
    """The factory the registry records; serving calls it to rebuild the model."""
    return CausalLMForServing(**kwargs)


def text_processing(cfg: dict[str, Any]) -> dict[str, Any]:
    """The processing spec registered with each revision: how the endpoint makes text."""
    return {"task": "text-generation", "max_tokens": cfg["new_tokens"],
            "max_context": cfg["block_size"], "max_tokens_limit": 4 * cfg["block_size"]}


def prompt_example(tokenizer: CharacterTokenizer) -> torch.Tensor:
    """The registered input example: the prompts' token ids, cut to one length."""
    ids = [tokenizer.encode(p) for p in PROMPTS]
    width = min(len(i) for i in ids)
    return torch.tensor([i[:width] for i in ids])


class WarmupCosine:
    """Learning-rate factor per optimizer step: linear warmup, then cosine decay to 10%."""

    def __init__(self, total_steps: int, warmup_fraction: float = 0.1,
                 floor: float = 0.1) -> None:
        self.total = max(int(total_steps), 1)
        self.warmup = max(1, int(self.total * warmup_fraction))
        self.floor = floor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))


class CausalLM(pl.LightningModule):
    """Next-character prediction; LoRA and FSDP2 sharding are applied in configure_model().

    The trainer inherits the baseline's weights into ``self.lm`` before ``configure_model``
    runs (names ``lm.transformer...`` on both sides), so LoRA wraps a model that already
    holds them. Under FSDP2 each transformer block is one shard unit.
    """

    def __init__(self, vocab: str, n_embd: int, n_layer: int, n_head: int, block_size: int,
                 learning_rate: float, weight_decay: float = 0.01, lora_rank: int = 0,
                 lora_alpha: float = 16.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lm = build_gpt(vocab, n_embd, n_layer, n_head, block_size)

    def configure_model(self) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if self.hparams.lora_rank and not isinstance(self.lm, PeftModel):
            # GPT-2 keeps its projections in Conv1D (weights stored transposed).
            self.lm = get_peft_model(self.lm, LoraConfig(
                r=self.hparams.lora_rank, lora_alpha=self.hparams.lora_alpha,
                target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.0,
                fan_in_fan_out=True))
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        gpt = self.lm.get_base_model() if isinstance(self.lm, PeftModel) else self.lm
        if isinstance(gpt, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"]
        for block in gpt.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(gpt, mesh=mesh)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["ids"].long()
        logits = self.lm(input_ids=ids[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               ids[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("lr", self.lr_schedulers().get_last_lr()[0], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in trainable if p.dim() >= 2]
        no_decay = [p for p in trainable if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.learning_rate, betas=(0.9, 0.95))
        # Exact: the trainer gives Lightning sized batches, so this is the real step count.
        schedule = WarmupCosine(self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                                                schedule),
                                 "interval": "step"}}


def create_lm(**kwargs: Any) -> CausalLM:
    """Runs on every Ray Train worker; seeded there, so every run starts from the same weights.

    Without the seed each run draws new initial weights (and LoRA adapters), and on text
    this small an unlucky draw can end a run on a plateau.
    """
    pl.seed_everything(SEED, workers=True, verbose=False)
    return CausalLM(**kwargs)


@torch.no_grad()
def mean_loss(lm: nn.Module, rows: list[dict]) -> float:
    """Mean next-character cross-entropy of ``lm`` (a GPT-2 LM head model) over ``rows``."""
    lm.eval()
    ids = torch.as_tensor(np.stack([r["ids"] for r in rows]))
    total = 0.0
    for chunk in ids.split(64):
        logits = lm(input_ids=chunk[:, :-1]).logits
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       chunk[:, 1:].reshape(-1), reduction="sum"))
    return total / (ids.shape[0] * (ids.shape[1] - 1))


# --- helpers for the tasks -------------------------------------------------------------------

def spec_text(spec: Any) -> str:
    return f"{spec.project_name}/{spec.model_name}:{spec.revision_id}"


def precision_for(use_gpu: bool) -> str:
    """bf16-mixed where the GPU supports it; full precision elsewhere (CPU autocast is slow)."""
    if use_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "16-mixed" if use_gpu else "32-true"


def scaling_for(size: str) -> ScalingConfig:
    cfg = SIZES[size]
    if size == "gpu":
        return ScalingConfig(num_workers=cfg["workers"], use_gpu=True,
                             resources_per_worker={"CPU": 2, "GPU": 1})
    # Declaring memory per worker gives the memory preflight its budget.
    return ScalingConfig(num_workers=cfg["workers"],
                         resources_per_worker={"CPU": 1, "memory": 2 * 2**30})


def memory_preflight(trainer: LightningTrainerWithStateDict) -> str:
    """The estimate the trainer's memory preflight made in its constructor, as one line."""
    estimate = trainer.memory_estimate
    if estimate is None:
        return ("memory preflight: skipped (no per-worker memory declared, or the model "
                "cannot be built on the meta device)")
    return (f"memory preflight: {estimate.parameters:,} parameters -> "
            f"{estimate.per_worker_bytes / 2**20:.1f} MiB per worker before activations, "
            f"{estimate.fraction:.1%} of {estimate.budget_bytes / 2**30:.2f} GiB "
            f"({estimate.budget_source})")


def make_trainer(size: str, strategy: str, model_kwargs: dict, train_rows: list[dict],
                 val_rows: list[dict], epochs: int, name: str,
                 transfer: TransferLearningSpec | None = None) -> LightningTrainerWithStateDict:
    scaling = scaling_for(size)
    return LightningTrainerWithStateDict(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_lm,
            create_model_fn_kwargs=model_kwargs,
            train_data=ray.data.from_items(train_rows),
            val_data=ray.data.from_items(val_rows),
            batch_size=SIZES[size]["batch_size"],
            lightning_trainer_kwargs={
                "max_epochs": epochs,
                "strategy": strategy,
                "precision": precision_for(scaling.use_gpu),
                # Norm clipping is sound under DDP and FSDP2 (gradients are DTensors, so the
                # norm covers every shard). FSDP1 ("fsdp") would need gradient_clip_algorithm=
                # "value"; the trainer refuses norm clipping there before anything starts.
                "gradient_clip_val": 1.0,
                "gradient_clip_algorithm": "norm",
                "log_every_n_steps": 5,
            },
            transfer_learning_spec=transfer,
        ),
        run_config=create_run_config(name=name, checkpoint_config=CheckpointConfig(
            num_to_keep=1)),
        scaling_config=scaling,
    )


def train_and_report(trainer: LightningTrainerWithStateDict, label: str) -> tuple[dict, str]:
    """Train; return the result and the preflight / batch lines (printed and returned)."""
    lines = (f"[{label}] {memory_preflight(trainer)}\n"
             f"[{label}] global batch size {trainer.global_batch_size} (batch_size "
             f"{trainer.trainer_param.batch_size} x {trainer.scaling_config.num_workers} "
             "worker(s) x gradient accumulation 1)")
    print(lines, flush=True)
    result = trainer.train()
    print(f"[{label}] trained: val_loss {float(result['metrics']['val_loss']):.3f}, "
          f"checkpoint {result['checkpoint_path']}", flush=True)
    return result, lines


def data_digest(*names: str) -> str:
    return hashlib.sha256("".join(read_text(n) for n in names).encode()).hexdigest()[:16]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- tasks -------------------------------------------------------------------------------------

@uniflow.task(config=CPU_CLUSTER)
def pretrain(size: str, strategy: str) -> dict:
    """Train the base model on ``pretrain.txt`` and register it."""
    cfg = SIZES[size]
    vocab = build_vocab()
    tokenizer = CharacterTokenizer(vocab)
    arch = {k: cfg[k] for k in ARCH_KEYS}
    train_rows, val_rows = text_windows(read_text("pretrain.txt"), tokenizer,
                                        cfg["block_size"], cfg["stride"])
    torch.manual_seed(SEED)
    init_loss = mean_loss(build_gpt(vocab, **arch), val_rows)
    trainer = make_trainer(size, strategy,
                           {"vocab": vocab, **arch, "learning_rate": cfg["learning_rate"]},
                           train_rows, val_rows, cfg["pretrain_epochs"], None)
    result, preflight = train_and_report(trainer, "pretrain")

    registry = ModelRegistry()
    spec = registry.register(
        PROJECT, BASE_MODEL, train_result=result, create_model_fn=create_causal_lm,
        create_model_fn_kwargs={"vocab": vocab, **arch}, input_example=prompt_example(tokenizer),
        tokenizer=tokenizer, processing=text_processing(cfg),
        description=f"character GPT-2 ({size}) pretrained on examples/gpt_lora/data/pretrain.txt",
        tags={"example": "gpt_lora", "size": size, "strategy": strategy},
        lineage={"text_sha256": data_digest("pretrain.txt")})
    # Read it back through the registry: what we measure is what was stored.
    base = registry.load_model(spec)
    base_loss = mean_loss(base.lm, val_rows)
    print(f"[pretrain] registered {spec_text(spec)}: val loss {init_loss:.3f} (random init) "
          f"-> {base_loss:.3f}", flush=True)
    return {"spec": spec_text(spec), "init_val_loss": init_loss, "val_loss": base_loss,
            "global_batch_size": trainer.global_batch_size, "preflight": preflight}


@uniflow.task(config=CPU_CLUSTER)
def finetune(base: dict, size: str, strategy: str) -> dict:
    """LoRA fine-tune a model that inherits the registered base; register it merged."""
    cfg = SIZES[size]
    registry = ModelRegistry()
    base_spec = parse_model_spec(base["spec"])
    vocab = registry.get(base_spec).factory["kwargs"]["vocab"]
    tokenizer = CharacterTokenizer(vocab)
    arch = {k: cfg[k] for k in ARCH_KEYS}
    train_rows, val_rows = text_windows(read_text("finetune.txt"), tokenizer,
                                        cfg["block_size"], cfg["stride"])
    base_loss = mean_loss(registry.load_model(base_spec).lm, val_rows)

    model_kwargs = {"vocab": vocab, **arch, "learning_rate": cfg["finetune_learning_rate"],
                    "lora_rank": cfg["lora_rank"]}
    transfer = TransferLearningSpec(
        metadata=TransferLearningMetadata(learning_mode=LearningMode.TRANSFER_LEARNING,
                                          baseline_model=base_spec),
        # Matched against the model as create_lm returns it (plain GPT-2 names, like the base
        # revision's), so the weights are in place before configure_model() adds LoRA.
        layer_names_to_inherit_regex=[r"^lm\."],
    )
    trainer = make_trainer(size, strategy, model_kwargs, train_rows, val_rows,
                           cfg["finetune_epochs"], None, transfer)
    result, preflight = train_and_report(trainer, "finetune")

    # Full weights from the (sharded) checkpoint into an unsharded LoRA model, then merge
    # the adapters so the registered revision is a plain GPT-2 again.
    model = create_lm(**model_kwargs)
    model.configure_model()
    trainer.update_model_state_dict(model)
    merged = model.lm.merge_and_unload()
    served = create_causal_lm(vocab=vocab, **arch)
    served.lm.load_state_dict(merged.state_dict())
    spec = registry.register(
        PROJECT, TUNED_MODEL, model=served, create_model_fn=create_causal_lm,
        create_model_fn_kwargs={"vocab": vocab, **arch}, train_result=result,
        input_example=prompt_example(tokenizer), tokenizer=tokenizer,
        processing=text_processing(cfg),
        description=f"{base['spec']} + LoRA (rank {cfg['lora_rank']}) on finetune.txt, merged",
        tags={"example": "gpt_lora", "size": size, "strategy": strategy, "adapters": "merged"},
        lineage={"baseline_model": base["spec"], "lora_rank": cfg["lora_rank"],
                 "text_sha256": data_digest("finetune.txt")})
    tuned_loss = mean_loss(registry.load_model(spec).lm, val_rows)
    print(f"[finetune] registered {spec_text(spec)}: keeper-log val loss {base_loss:.3f} "
          f"(base) -> {tuned_loss:.3f}", flush=True)
    return {"spec": spec_text(spec), "base_val_loss": base_loss, "val_loss": tuned_loss,
            "global_batch_size": trainer.global_batch_size, "preflight": preflight}


@uniflow.task(config=CPU_CLUSTER)
def serve(tuned: dict, size: str, port: int) -> dict:
    """Deploy the fine-tuned revision; ask it to continue the prompts, plain and streamed."""
    from michelangelo.lib.serving import deploy

    cfg = SIZES[size]
    registry = ModelRegistry()
    endpoint = deploy(tuned["spec"], name="gpt-keeper", port=port or free_port(),
                      registry=registry)
    continuations = {p: endpoint.generate(p, max_tokens=cfg["new_tokens"]) for p in PROMPTS}
    for prompt, text in continuations.items():
        print(f"[serve] {prompt!r} -> {text!r}", flush=True)
    streamed = list(endpoint.generate_stream(PROMPTS[0], max_tokens=cfg["new_tokens"]))
    print(f"[serve] streamed in {len(streamed)} events: {''.join(streamed)!r}", flush=True)
    body = json.dumps({"text_input": PROMPTS[0], "parameters": {"max_tokens": 16}})
    for path in ("generate", "generate_stream"):
        print(f"[serve] try it while the cluster is up: curl -s{'N' if 'stream' in path else ''}"
              f" -X POST {endpoint.base_url}/v2/models/gpt-keeper/{path} "
              f"-H 'Content-Type: application/json' -d '{body}'", flush=True)
    return {"url": endpoint.url, "generate_url": endpoint.generate_url,
            "continuations": continuations, "streamed": streamed}


@uniflow.workflow()
def gpt_lora(size: str = "default", strategy: str = "fsdp2", port: int = 0) -> dict:
    """Pretrain, register, LoRA fine-tune from the registered base, register, deploy."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not one of {sorted(SIZES)}. Fix: --size tiny for a "
                         "quick check, default on a laptop, gpu with CUDA.")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {list(STRATEGIES)}. Fix: "
                         "--strategy fsdp2 (sharded) or ddp (replicated).")
    cluster = GPU_CLUSTER if size == "gpu" else CPU_CLUSTER
    base = pretrain.with_overrides(config=cluster)(size, strategy)
    tuned = finetune.with_overrides(config=cluster)(base, size, strategy)
    endpoint = serve.with_overrides(config=cluster)(tuned, size, port)
    return {"pretrain": base, "finetune": tuned, "endpoint": endpoint}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="default", choices=sorted(SIZES))
    parser.add_argument("--strategy", default="fsdp2", choices=STRATEGIES)
    parser.add_argument("--port", type=int, default=0, help="Serve HTTP port (0: a free one)")
    args, rest = parser.parse_known_args(argv)
    report = uniflow.create_context(rest).run(gpt_lora, size=args.size,
                                              strategy=args.strategy, port=args.port)
    pre, tuned = report["pretrain"], report["finetune"]
    print(pre["preflight"], tuned["preflight"], sep="\n")
    print(f"gpt_lora: pretrain val loss {pre['init_val_loss']:.3f} -> {pre['val_loss']:.3f} "
          f"({pre['spec']}); fine-tune val loss {tuned['base_val_loss']:.3f} -> "
          f"{tuned['val_loss']:.3f} ({tuned['spec']})")
    for prompt, text in report["endpoint"]["continuations"].items():
        print(f"endpoint {report['endpoint']['url']}: {prompt!r} -> {text!r}")
    print("RESULT " + json.dumps(report))
    return report


if __name__ == "__main__":
    main()
