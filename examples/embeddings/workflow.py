"""Contrastive text embeddings: train (InfoNCE, in-batch negatives) -> register -> deploy.

Run it with ``python examples/embeddings/workflow.py`` (``--size tiny|default|gpu``).
Everything ships with the example, nothing is downloaded:

1. ``train``: a word-level tokenizer is built with the ``tokenizers`` library from the
   example's own sentence pairs (``data/pairs.tsv``: a sentence and a paraphrase of it per
   line). A small transformer encoder learns to put each sentence next to its paraphrase
   and away from every other sentence in the batch (InfoNCE with in-batch negatives). The
   embeddings of all Ray Train workers are gathered before the loss, so each sentence is
   contrasted with the whole global batch, not just its worker's share.
2. The trained encoder is registered (``text-encoder``) with its tokenizer as a factory
   argument, so a client can tokenise from the registry alone.
3. ``serve``: the revision is deployed on Ray Serve; the endpoint answers token ids with
   L2-normalised vectors, and the example ranks a few sentences by cosine similarity to a
   query with them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainerParam,
    LightningTrainerWithStateDict,
)
from michelangelo.uniflow.plugins.ray import RayTask, create_run_config

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = "examples"
MODEL = "text-encoder"
MAX_LEN = 16  # tokens per sentence; longer ones are cut, shorter ones padded
PAD, UNK = "[PAD]", "[UNK]"

# "tiny" is for tests, "default" fits a 2-core laptop in a few minutes, "gpu" is for CUDA.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"dim": 32, "layers": 1, "heads": 2, "out_dim": 32, "epochs": 8, "batch_size": 8,
             "workers": 2, "learning_rate": 3e-3},
    "default": {"dim": 64, "layers": 2, "heads": 4, "out_dim": 64, "epochs": 20,
                "batch_size": 8, "workers": 2, "learning_rate": 2e-3},
    "gpu": {"dim": 256, "layers": 4, "heads": 8, "out_dim": 128, "epochs": 40,
            "batch_size": 32, "workers": 1, "learning_rate": 1e-3},
}

QUERY = "heavy snow is falling on the hills"
CANDIDATES = (
    "the hills are turning white with snow",
    "cook the noodles in a pot of salty water",
    "the city train has been delayed",
    "hoist the sail once we are out of the port",
    "the crowd applauded for many minutes",
    "restart the computer to install updates",
)

# One node on a laptop (the fewest Ray processes): two Ray Train workers of 1 CPU and 2 GiB,
# a CPU for Ray Data and room for the Serve replica.
CPU_CLUSTER = RayTask(head_cpu=4, head_memory="8Gi")
GPU_CLUSTER = RayTask(head_cpu=2, head_memory="8Gi", worker_cpu=4, worker_memory="32Gi",
                      worker_gpu=1, worker_instances=1)


# --- data and tokenizer -----------------------------------------------------------------------

def read_pairs() -> list[tuple[str, str]]:
    """``data/pairs.tsv``: one ``sentence<TAB>paraphrase`` per line."""
    pairs = []
    with open(os.path.join(HERE, "data", "pairs.tsv"), encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 2:
                raise ValueError(f"pairs.tsv line {number} has {len(parts)} fields, not 2: "
                                 f"{line!r}. Fix: one sentence, a tab, its paraphrase.")
            pairs.append((parts[0], parts[1]))
    return pairs


def build_tokenizer(texts: list[str]) -> str:
    """A lower-case word-level tokenizer trained on ``texts``, as its JSON."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=[PAD, UNK]))
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(PAD), pad_token=PAD, length=MAX_LEN)
    tokenizer.enable_truncation(max_length=MAX_LEN)
    return tokenizer.to_str()


def encode(tokenizer_json: str, texts: list[str]) -> list[list[int]]:
    """Token ids, padded (with 0) or cut to ``MAX_LEN``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    return [e.ids for e in tokenizer.encode_batch(texts)]


def split_pairs(pairs: list[tuple[str, str]], val_count: int = 16
                ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    shuffled = list(pairs)
    random.Random(0).shuffle(shuffled)
    return shuffled[val_count:], shuffled[:val_count]


def pair_rows(tokenizer_json: str, pairs: list[tuple[str, str]]) -> list[dict]:
    anchors = encode(tokenizer_json, [a for a, _ in pairs])
    positives = encode(tokenizer_json, [p for _, p in pairs])
    return [{"anchor": np.asarray(a, np.int64), "positive": np.asarray(p, np.int64)}
            for a, p in zip(anchors, positives, strict=True)]


# --- model -------------------------------------------------------------------------------------

class TextEncoder(nn.Module):
    """Token ids ``[batch, MAX_LEN]`` (0 = padding) to unit-length vectors ``[batch, out_dim]``.

    Args:
        tokenizer_json: The tokenizer (kept so the revision carries it; sets the vocabulary).
        dim, layers, heads: Transformer shape.
        out_dim: Embedding size.
    """

    def __init__(self, tokenizer_json: str, dim: int, layers: int, heads: int,
                 out_dim: int) -> None:
        super().__init__()
        vocab_size = json.loads(tokenizer_json)["model"]["vocab"].__len__()
        self.vocab_size = vocab_size
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.positions = nn.Embedding(MAX_LEN, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.project = nn.Linear(dim, out_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[1] > MAX_LEN or int(input_ids.min()) < 0 \
                or int(input_ids.max()) >= self.vocab_size:
            raise ValueError(f"input_ids must be [batch, <= {MAX_LEN}] token ids in "
                             f"[0, {self.vocab_size}); got shape {list(input_ids.shape)}.")
        ids = input_ids.long()
        padding = ids == 0
        padding[:, 0] = False  # an all-padding row would attend to nothing and give NaN
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.encoder(self.tokens(ids) + self.positions(positions),
                              src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * keep).sum(1) / keep.sum(1)
        return F.normalize(self.project(pooled).float(), dim=-1)


def create_encoder(**kwargs: Any) -> TextEncoder:
    """The factory the registry records; serving calls it to rebuild the model."""
    return TextEncoder(**kwargs)


def info_nce(queries: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor,
             offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric InfoNCE: row ``i`` of ``queries`` matches row ``offset + i`` of ``keys``.

    ``keys`` may hold more rows than ``queries`` (the other workers' embeddings): every row
    that is not the match is a negative. Returns the loss and the top-1 accuracy.
    """
    labels = torch.arange(queries.shape[0], device=queries.device) + offset
    logits = scale * queries @ keys.T
    loss = F.cross_entropy(logits, labels)
    accuracy = (logits.argmax(dim=1) == labels).float().mean()
    return loss, accuracy


class ContrastiveModule(pl.LightningModule):
    """Trains a :class:`TextEncoder` with InfoNCE over the global batch."""

    def __init__(self, tokenizer_json: str, dim: int, layers: int, heads: int, out_dim: int,
                 learning_rate: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = TextEncoder(tokenizer_json, dim, layers, heads, out_dim)
        # A learned temperature (as in CLIP), starting at 1/0.07.
        self.log_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))

    def _gathered(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        if self.trainer.world_size == 1:
            return x, 0
        every = self.all_gather(x, sync_grads=True)  # [world, batch, dim], differentiable
        return every.reshape(-1, x.shape[-1]), self.global_rank * x.shape[0]

    def training_step(self, batch, batch_idx):
        anchors = self.encoder(batch["anchor"])
        positives = self.encoder(batch["positive"])
        scale = self.log_scale.clamp(max=np.log(100.0)).exp()
        all_positives, offset = self._gathered(positives)
        all_anchors, _ = self._gathered(anchors)
        loss_a, accuracy = info_nce(anchors, all_positives, scale, offset)
        loss_p, _ = info_nce(positives, all_anchors, scale, offset)
        loss = (loss_a + loss_p) / 2
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("train_top1", accuracy, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, accuracy = info_nce(self.encoder(batch["anchor"]),
                                  self.encoder(batch["positive"]), self.log_scale.exp())
        self.log("val_loss", loss, sync_dist=True)
        self.log("val_top1", accuracy, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate,
                                      weight_decay=0.01)
        # Warmup for the first 10% of steps, then cosine decay, stepped per optimizer step.
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.learning_rate,
            total_steps=int(self.trainer.estimated_stepping_batches), pct_start=0.1,
            anneal_strategy="cos", cycle_momentum=False)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def create_module(**kwargs: Any) -> ContrastiveModule:
    """Runs on every Ray Train worker."""
    return ContrastiveModule(**kwargs)


@torch.no_grad()
def evaluate(encoder: TextEncoder, rows: list[dict]) -> dict[str, float]:
    """InfoNCE loss (temperature 0.05) and top-1 retrieval accuracy over all ``rows`` at once."""
    encoder.eval()
    anchors = encoder(torch.as_tensor(np.stack([r["anchor"] for r in rows])))
    positives = encoder(torch.as_tensor(np.stack([r["positive"] for r in rows])))
    loss, accuracy = info_nce(anchors, positives, torch.tensor(20.0))
    return {"loss": float(loss), "top1": float(accuracy)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spec_text(spec: Any) -> str:
    return f"{spec.project_name}/{spec.model_name}:{spec.revision_id}"


# --- tasks -------------------------------------------------------------------------------------

@uniflow.task(config=CPU_CLUSTER)
def train(size: str) -> dict:
    """Build the tokenizer, train the encoder on the pairs, register it."""
    cfg = SIZES[size]
    pairs = read_pairs()
    tokenizer_json = build_tokenizer([s for pair in pairs for s in pair])
    train_pairs, val_pairs = split_pairs(pairs)
    train_rows, val_rows = pair_rows(tokenizer_json, train_pairs), pair_rows(tokenizer_json,
                                                                              val_pairs)
    encoder_kwargs = {"tokenizer_json": tokenizer_json,
                      **{k: cfg[k] for k in ("dim", "layers", "heads", "out_dim")}}
    torch.manual_seed(0)
    before = evaluate(create_encoder(**encoder_kwargs), train_rows)

    use_gpu = size == "gpu"
    trainer = LightningTrainerWithStateDict(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_module,
            create_model_fn_kwargs={**encoder_kwargs, "learning_rate": cfg["learning_rate"]},
            train_data=ray.data.from_items(train_rows),
            val_data=ray.data.from_items(val_rows),
            batch_size=cfg["batch_size"],
            lightning_trainer_kwargs={
                "max_epochs": cfg["epochs"],
                "strategy": "ddp",
                "precision": "bf16-mixed" if use_gpu and torch.cuda.is_available()
                and torch.cuda.is_bf16_supported() else "32-true",
                "gradient_clip_val": 1.0,
                "log_every_n_steps": 5,
            },
        ),
        run_config=create_run_config(checkpoint_config=CheckpointConfig(num_to_keep=1)),
        scaling_config=ScalingConfig(num_workers=cfg["workers"], use_gpu=use_gpu,
                                     resources_per_worker={"CPU": 1, "GPU": 1} if use_gpu
                                     else {"CPU": 1, "memory": 2 * 2**30}),
    )
    print(f"[train] {len(train_rows)} training pairs; global batch size "
          f"{trainer.global_batch_size}: each sentence is scored against the "
          f"{trainer.global_batch_size} paraphrases of the global batch (1 match, "
          f"{trainer.global_batch_size - 1} negatives)", flush=True)
    result = trainer.train()

    module = create_module(**encoder_kwargs, learning_rate=cfg["learning_rate"])
    trainer.update_model_state_dict(module)
    registry = ModelRegistry()
    example = torch.tensor(encode(tokenizer_json, [QUERY, CANDIDATES[0]]))
    spec = registry.register(
        PROJECT, MODEL, model=module.encoder, create_model_fn=create_encoder,
        create_model_fn_kwargs=encoder_kwargs, train_result=result, input_example=example,
        description=f"contrastive sentence encoder ({size}) on examples/embeddings/data/pairs.tsv",
        tags={"example": "embeddings", "size": size, "loss": "InfoNCE, in-batch negatives"})
    encoder = registry.load_model(spec)
    after = evaluate(encoder, train_rows)
    val = evaluate(encoder, val_rows)
    print(f"[train] registered {spec_text(spec)}: training-pair InfoNCE {before['loss']:.3f} -> "
          f"{after['loss']:.3f}, top-1 {before['top1']:.2f} -> {after['top1']:.2f}; held-out "
          f"pairs top-1 {val['top1']:.2f} (chance {1 / len(val_rows):.2f})", flush=True)
    return {"spec": spec_text(spec), "train_loss_before": before["loss"],
            "train_loss_after": after["loss"], "train_top1": after["top1"],
            "val_top1": val["top1"], "global_batch_size": trainer.global_batch_size}


@uniflow.task(config=CPU_CLUSTER)
def serve(trained: dict, port: int) -> dict:
    """Deploy the encoder; rank the candidates by similarity to the query over HTTP."""
    from michelangelo.lib.serving import deploy

    registry = ModelRegistry()
    tokenizer_json = registry.get(trained["spec"]).factory["kwargs"]["tokenizer_json"]
    endpoint = deploy(trained["spec"], name="text-encoder", port=port or free_port(),
                      registry=registry)
    texts = [QUERY, *CANDIDATES]
    vectors = np.asarray(endpoint.predict(encode(tokenizer_json, texts)), dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    scores = vectors[1:] @ vectors[0]
    ranking = [(CANDIDATES[i], float(scores[i])) for i in np.argsort(-scores)]
    print(f"[serve] nearest neighbours of {QUERY!r}:", flush=True)
    for text, score in ranking:
        print(f"[serve]   {score:+.3f}  {text}", flush=True)
    return {"url": endpoint.url, "dim": int(vectors.shape[1]),
            "norms": [float(n) for n in norms], "ranking": ranking}


@uniflow.workflow()
def embeddings(size: str = "default", port: int = 0) -> dict:
    """Train a contrastive text encoder, register it, deploy it, query it."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not one of {sorted(SIZES)}. Fix: --size tiny for a "
                         "quick check, default on a laptop, gpu with CUDA.")
    cluster = GPU_CLUSTER if size == "gpu" else CPU_CLUSTER
    trained = train.with_overrides(config=cluster)(size)
    endpoint = serve.with_overrides(config=cluster)(trained, port)
    return {"train": trained, "endpoint": endpoint}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="default", choices=sorted(SIZES))
    parser.add_argument("--port", type=int, default=0, help="Serve HTTP port (0: a free one)")
    args, rest = parser.parse_known_args(argv)
    report = uniflow.create_context(rest).run(embeddings, size=args.size, port=args.port)
    trained = report["train"]
    print(f"embeddings: training-pair InfoNCE {trained['train_loss_before']:.3f} -> "
          f"{trained['train_loss_after']:.3f}; nearest to {QUERY!r}: "
          f"{report['endpoint']['ranking'][0][0]!r} ({trained['spec']})")
    print(f"endpoint {report['endpoint']['url']}: nearest neighbours of {QUERY!r}")
    for text, score in report["endpoint"]["ranking"]:
        print(f"  {score:+.3f}  {text}")
    print("RESULT " + json.dumps(report))
    return report


if __name__ == "__main__":
    main()
