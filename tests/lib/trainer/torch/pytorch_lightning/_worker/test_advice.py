"""The practice's quiet failure modes: the warnings rank 0 gives as training starts.

The scheduler check runs on a plain in-process Lightning fit (no Ray) with modules written
as the practice writes them; the padding and fp16 messages are checked as functions, since
padding needs several ranks (the DataModule tests run those) and bf16 a GPU
(``bench/gpu_check.sh``).
"""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from _models import TinyRegressor, regression_rows
from transformers import get_cosine_schedule_with_warmup

from michelangelo.lib.trainer.torch.pytorch_lightning._worker._advice import (
    PracticeWarnings,
    fp16_advice,
    padded_validation_advice,
)


class EpochScheduled(TinyRegressor):
    """Warmup plus cosine from transformers, returned without ``"interval": "step"``."""

    def __init__(self, interval: str | None = None, warmup: int = 100):
        super().__init__()
        self.interval, self.warmup = interval, warmup

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = get_cosine_schedule_with_warmup(opt, self.warmup,
                                                self.trainer.estimated_stepping_batches)
        config = {"scheduler": sched}
        if self.interval:
            config["interval"] = self.interval
        return {"optimizer": opt, "lr_scheduler": config}


def _fit(model, max_epochs=2):
    rows = [{"x": torch.tensor(r["x"]), "y": torch.tensor(r["y"])} for r in regression_rows(32)]
    loader = torch.utils.data.DataLoader(rows, batch_size=8)
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[PracticeWarnings()])
    trainer.fit(model, loader)


def test_a_per_epoch_warmup_longer_than_the_run_warns_once():
    with pytest.warns(UserWarning) as caught:
        _fit(EpochScheduled(), max_epochs=2)
    ours = [str(w.message) for w in caught if "learning-rate scheduler" in str(w.message)]
    assert len(ours) == 1
    assert "LambdaLR is stepped once per epoch" in ours[0]
    assert "spans 8 steps (num_training_steps)" in ours[0]  # 4 batches x 2 epochs
    assert "trains 2 epoch(s)" in ours[0]
    assert "'interval': 'step'" in ours[0]


def test_a_scheduler_stepped_per_step_or_within_the_epochs_gives_no_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(EpochScheduled(interval="step"), max_epochs=2)

        class ShortSchedule(TinyRegressor):
            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.
                        CosineAnnealingLR(opt, T_max=2)}

        _fit(ShortSchedule(), max_epochs=2)
    assert not [w for w in caught if "learning-rate scheduler" in str(w.message)]


def test_padded_validation_says_how_many_samples_repeat():
    message = padded_validation_advice([15], world_size=4)
    assert "15 samples (1 repeated)" in message
    assert "4 ranks" in message and "multiple of 4 samples" in message
    assert padded_validation_advice([16], world_size=4) is None
    assert padded_validation_advice([15], world_size=1) is None


def test_fp16_on_a_bf16_gpu_suggests_bf16_mixed():
    assert "'bf16-mixed'" in fp16_advice("16-mixed", bf16_supported=True)
    assert fp16_advice("16-mixed", bf16_supported=False) is None
    assert fp16_advice("bf16-mixed", bf16_supported=True) is None


def test_val_data_that_does_not_split_evenly_warns_on_the_driver(ray_cluster):
    from _models import create_tiny_model, make_regression_datasets
    from ray.train import ScalingConfig

    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer,
        LightningTrainerParam,
    )

    train, val = make_regression_datasets(32, 15)
    with pytest.warns(UserWarning, match=r"val_data has 15 rows, which do not split evenly over "
                                         r"2 workers.*1 row\(s\) are left out.*e\.g\. 14 or 16"):
        LightningTrainer(
            trainer_param=LightningTrainerParam(create_model_fn=create_tiny_model,
                                                create_model_fn_kwargs={}, train_data=train,
                                                val_data=val),
            scaling_config=ScalingConfig(num_workers=2))
