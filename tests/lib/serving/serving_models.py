"""Tiny models the serving tests register (factories must be importable by replicas)."""

from __future__ import annotations

import torch
from torch import nn


class RowLinear(nn.Module):
    """``y = x @ w + b`` per row, plus ``batch_rows``: how many rows shared the forward pass.

    ``batch_rows`` lets a test see dynamic batching from outside: every row of one forward
    pass reports that pass's size.
    """

    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = torch.full((x.shape[0], 1), x.shape[0], dtype=torch.int64)
        return {"y": self.linear(x), "batch_rows": rows}


def create_row_linear(features: int = 4) -> nn.Module:
    return RowLinear(features)


class Mixed(nn.Module):
    """Named inputs of three datatypes: ``sum(x) * (+1 if flag else -1) + k``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, k: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        sign = torch.where(flag, 1.0, -1.0)
        return x.sum(dim=1, keepdim=True) * self.scale * sign + k.float()


def create_mixed() -> nn.Module:
    return Mixed()


class Drifting(nn.Module):
    """Its output depends on a non-persistent random buffer: another process cannot reproduce
    the registered example (as when model code changes after registration)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.register_buffer("noise", torch.randn(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.noise


def create_drifting() -> nn.Module:
    return Drifting()


def register_row_linear(registry, model_name: str = "rows", seed: int = 0, features: int = 4):
    torch.manual_seed(seed)
    model = create_row_linear(features)
    return registry.register("serving", model_name, model=model,
                             create_model_fn=create_row_linear,
                             create_model_fn_kwargs={"features": features},
                             input_example=torch.randn(2, features))


def register_mixed(registry):
    model = create_mixed()
    example = {"x": torch.randn(2, 3), "k": torch.tensor([[1], [2]]),
               "flag": torch.tensor([[True], [False]])}
    return registry.register("serving", "mixed", model=model, create_model_fn=create_mixed,
                             input_example=example)


def register_drifting(registry):
    model = create_drifting()
    return registry.register("serving", "drifting", model=model, create_model_fn=create_drifting,
                             input_example=torch.randn(2, 2))


class NanSafe(nn.Module):
    """Treats NaN as 0 and clips infinities: a model that handles non-finite inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(x, nan=0.0, posinf=1e6, neginf=-1e6).sum(dim=1, keepdim=True)


def create_nan_safe() -> nn.Module:
    return NanSafe()


class Brittle(RowLinear):
    """A :class:`RowLinear` that raises on inputs far outside its registered example (whose
    values are small): it passes readiness, then fails real requests with large values."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.abs().max() > 20:
            raise RuntimeError("input outside the range this revision was trained on")
        return super().forward(x)


def create_brittle(features: int = 4) -> nn.Module:
    return Brittle(features)


def register_brittle(registry, model_name: str = "rows", seed: int = 2, features: int = 4):
    torch.manual_seed(seed)
    return registry.register("serving", model_name, model=create_brittle(features),
                             create_model_fn=create_brittle,
                             create_model_fn_kwargs={"features": features},
                             input_example=torch.randn(2, features))


TEXT_VOCAB = " abcdefghijklmnopqrstuvwxyz.,!?"


class TinyCausalLM(nn.Module):
    """One causal self-attention layer over characters: token ids in, logits out.

    Each position sees only itself and earlier positions (``is_causal``), as in any GPT.
    """

    def __init__(self, vocab_size: int = len(TEXT_VOCAB), width: int = 16,
                 context: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(context, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1])
        h = self.embed(input_ids) + self.position(positions)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return {"logits": self.head(h) * 4.0}


def create_tiny_causal_lm(**kwargs) -> nn.Module:
    return TinyCausalLM(**kwargs)


def register_text_model(registry, model_name: str = "chars", seed: int = 0, **processing):
    from michelangelo.lib.model_registry import CharacterTokenizer

    torch.manual_seed(seed)
    tokenizer = CharacterTokenizer(TEXT_VOCAB)
    example = torch.tensor([tokenizer.encode("hello there"), tokenizer.encode("a lighthouse")[:11]])
    return registry.register(
        "serving", model_name, model=create_tiny_causal_lm(), create_model_fn=create_tiny_causal_lm,
        input_example=example, tokenizer=tokenizer,
        processing={"task": "text-generation", "max_tokens": 8, "max_context": 32, **processing})
