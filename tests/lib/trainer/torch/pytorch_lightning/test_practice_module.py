"""The practice's ``CausalLMFineTune``, as ``lightning-in-depth`` writes it, on two CPU workers.

Only the model's size changed: the module builds GPT-2 from a small ``GPT2Config`` instead
of downloading weights. The Trainer arguments are the text's, scaled down (``max_steps``,
``accumulate_grad_batches``, ``val_check_interval``, ``log_every_n_steps``, its two callbacks)
and the driver seeds with ``L.seed_everything(1234, workers=True)`` as the text does. A
callback of the test's own records, on each rank, what the run did; the module is untouched.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from _models import SAME_IMPORTS_ENV, ship_by_value
from ray.train import CheckpointConfig, RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

L = pytest.importorskip("lightning")
transformers = pytest.importorskip("transformers")

from lightning.pytorch.callbacks import (  # noqa: E402
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
)
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GPT2Config,
    get_cosine_schedule_with_warmup,
)

ship_by_value(__name__)

pytestmark = [pytest.mark.lightning_packages, pytest.mark.usefixtures("ray_cluster")]
RAY_NUM_CPUS = 3
RAY_ENV_VARS = SAME_IMPORTS_ENV

VOCAB, SEQ_LEN = 64, 16
MAX_STEPS, ACCUMULATE, BATCH = 6, 2, 2
BATCHES_PER_RANK = 13  # one epoch holds MAX_STEPS * ACCUMULATE = 12 micro-batches


def tiny_gpt2(model_name: str) -> GPT2Config:
    """The one change from the text: a GPT-2 small enough for a CPU test, built, not fetched."""
    return GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2,
                      name_or_path=model_name)


class CausalLMFineTune(L.LightningModule):
    def __init__(self, model_name: str, lr: float = 2e-5, warmup: int = 100):
        super().__init__()
        self.save_hyperparameters()          # stored in every checkpoint
        self.model = AutoModelForCausalLM.from_config(tiny_gpt2(model_name))

    def training_step(self, batch, batch_idx):
        out = self.model(**batch)            # labels in batch -> out.loss
        self.log("train/loss", out.loss, prog_bar=True)
        return out.loss                      # Trainer does backward and step

    def validation_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("val/loss", loss, sync_dist=True)   # mean across ranks

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                weight_decay=0.1)
        sched = get_cosine_schedule_with_warmup(
            opt, self.hparams.warmup, self.trainer.estimated_stepping_batches)
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class RecordRun(Callback):
    """The test's eyes on each rank: steps, batches, the schedule, the validation losses."""

    def __init__(self, record_dir: str):
        self.record_dir = record_dir
        self.batches = 0
        self.val_losses: list[float] = []
        self.scheduler_steps: list[int] = []

    def setup(self, trainer, pl_module, stage):
        # Before the strategy wraps the model (DDP would broadcast rank 0's weights).
        self.first_weight = float(pl_module.model.transformer.wte.weight.flatten()[0])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1
        self.scheduler_steps.append(trainer.lr_scheduler_configs[0].scheduler.last_epoch)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val_losses.append(float(trainer.callback_metrics["val/loss"]))

    def on_train_end(self, trainer, pl_module):
        monitor = next(c for c in trainer.callbacks if isinstance(c, LearningRateMonitor))
        checkpoint = trainer.checkpoint_callback
        record = {
            "global_step": trainer.global_step,
            "batches": self.batches,
            "estimated_stepping_batches": trainer.estimated_stepping_batches,
            "scheduler_steps": self.scheduler_steps,
            "lrs": {name: [float(v) for v in values] for name, values in monitor.lrs.items()},
            "val_losses": self.val_losses,
            "best_model_score": float(checkpoint.best_model_score),
            "first_weight": self.first_weight,
        }
        path = os.path.join(self.record_dir, f"rank{trainer.global_rank}.json")
        with open(path, "w") as handle:
            json.dump(record, handle)


def token_rows(n_rows: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Causal-LM rows: token ids, their mask, and the ids again as labels."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        ids = rng.integers(0, VOCAB, size=SEQ_LEN, dtype=np.int64)
        rows.append({"input_ids": ids, "attention_mask": np.ones(SEQ_LEN, dtype=np.int64),
                     "labels": ids.copy()})
    return rows


def test_the_practice_module_trains_as_written(tmp_path):
    import ray.data

    records = tmp_path / "records"
    records.mkdir()
    train = ray.data.from_items(token_rows(2 * BATCH * BATCHES_PER_RANK, seed=0))
    val = ray.data.from_items(token_rows(2 * BATCH * 2, seed=1))
    lr, warmup = 1e-3, 2
    L.seed_everything(1234, workers=True)
    try:
        with pytest.warns(UserWarning, match=r"max_steps=6 without max_epochs.*max_epochs'\]=-1"):
            trainer = LightningTrainer(
                trainer_param=LightningTrainerParam(
                    create_model_fn=CausalLMFineTune,
                    create_model_fn_kwargs={"model_name": "tiny-gpt2", "lr": lr,
                                            "warmup": warmup},
                    train_data=train, val_data=val, batch_size=BATCH,
                    lightning_trainer_kwargs={
                        "max_steps": MAX_STEPS,
                        "accumulate_grad_batches": ACCUMULATE,
                        "val_check_interval": 4,
                        "log_every_n_steps": 1,
                        "callbacks": [
                            ModelCheckpoint(monitor="val/loss", save_last=True, save_top_k=2),
                            LearningRateMonitor(logging_interval="step"),
                            RecordRun(str(records)),
                        ],
                    }),
                run_config=RunConfig(
                    name="causal", storage_path=str(tmp_path / "ray"),
                    checkpoint_config=CheckpointConfig(
                        num_to_keep=2, checkpoint_score_attribute="val/loss",
                        checkpoint_score_order="min")),
                scaling_config=ScalingConfig(num_workers=2),
            )
        result = trainer.train()
    finally:
        for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
            os.environ.pop(name, None)

    ranks = [json.loads((records / f"rank{r}.json").read_text()) for r in (0, 1)]
    for record in ranks:
        # Both ranks trained, to max_steps counted in optimizer steps, not micro-batches.
        assert record["global_step"] == MAX_STEPS
        assert record["batches"] == MAX_STEPS * ACCUMULATE
        # estimated_stepping_batches sized the cosine schedule ...
        assert record["estimated_stepping_batches"] == MAX_STEPS
        # ... and the scheduler advanced once per optimizer step (interval "step").
        assert record["scheduler_steps"] == [(i + 1) // ACCUMULATE for i in range(12)]
    # The driver's seed_everything reached the workers: the same initial weights everywhere,
    # and the ones the driver's seed gives.
    L.seed_everything(1234, workers=True)
    expected = CausalLMFineTune("tiny-gpt2").model.transformer.wte.weight.flatten()[0].item()
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        os.environ.pop(name, None)
    assert ranks[0]["first_weight"] == ranks[1]["first_weight"] == expected

    # LearningRateMonitor saw warmup then cosine decay, one value per optimizer step.
    lrs = ranks[0]["lrs"]["lr-AdamW"]
    schedule = _cosine_with_warmup(lr, warmup, MAX_STEPS)
    assert _deduplicated(lrs) == pytest.approx(_deduplicated(schedule[:len(_deduplicated(lrs))]))
    assert max(lrs) == pytest.approx(lr)

    # The best checkpoint is chosen by val/loss: Lightning's and Ray's agree.
    val_losses = ranks[0]["val_losses"]
    assert len(val_losses) >= 2
    assert ranks[0]["best_model_score"] == pytest.approx(min(val_losses))
    best_checkpoint, best_metrics = min(result_best(trainer, result), key=lambda cm: cm[1])
    assert best_metrics == pytest.approx(min(val_losses))

    # save_hyperparameters() values are in the kept checkpoint.
    checkpoint = torch.load(os.path.join(best_checkpoint, "checkpoint.ckpt"),
                            map_location="cpu", weights_only=False)
    assert dict(checkpoint["hyper_parameters"]) == {"model_name": "tiny-gpt2", "lr": lr,
                                                    "warmup": warmup}
    assert {"train/loss", "val/loss"} <= set(result["metrics"])
    assert result["metrics"]["step"] == MAX_STEPS


def result_best(trainer, result) -> list[tuple[str, float]]:
    """``(folder, val/loss)`` of each checkpoint Ray kept for the run."""
    from ray.train import Result

    kept = Result.from_path(result["path"]).best_checkpoints
    return [(checkpoint.path, metrics["val/loss"]) for checkpoint, metrics in kept]


def _cosine_with_warmup(lr: float, warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total)
    values = []
    for _ in range(total):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def _deduplicated(values: list[float]) -> list[float]:
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
