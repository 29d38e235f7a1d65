"""Tokenizers stored with a revision as data (JSON), and the text processing spec beside them.

Two kinds are stored, neither pickled:

- ``tokenizers``: a ``tokenizers.Tokenizer`` (Hugging Face's library), saved as its own
  ``tokenizer.json`` and read back with ``Tokenizer.from_str``.
- ``characters``: a :class:`CharacterTokenizer`, one token per character, saved as
  ``vocab.json`` (the tokens in id order and the stand-in for unknown characters).

The processing spec says what serving does with them: ``{"task": "text-generation",
"max_tokens", "max_context", "temperature", "eos_token_id"}`` (see :func:`check_processing`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from michelangelo.errors import InputError

__all__ = ["CharacterTokenizer", "TextTokenizer", "check_processing", "decode_tokenizer",
           "encode_tokenizer"]

TASKS = ("text-generation",)
_FILES = {"tokenizers": "tokenizer.json", "characters": "vocab.json"}


class CharacterTokenizer:
    """One token per character: ``vocab[i]`` is token ``i``.

    Args:
        vocab: The characters in token-id order (a string or a list of one-character strings).
        unknown: The character unknown ones become (it must be in ``vocab``).
    """

    def __init__(self, vocab: str | Sequence[str], unknown: str = " ") -> None:
        tokens = list(vocab)
        if not tokens or any(not isinstance(t, str) or len(t) != 1 for t in tokens):
            raise InputError("CharacterTokenizer vocab must be a non-empty string (or list of "
                             f"single characters), got {str(vocab)[:40]!r}.")
        if len(set(tokens)) != len(tokens):
            raise InputError("CharacterTokenizer vocab repeats a character; each must be unique.")
        if unknown not in tokens:
            raise InputError(f"CharacterTokenizer unknown={unknown!r} is not in the vocab. Fix: "
                             "pass a character of the vocab, e.g. ' '.")
        self.vocab = "".join(tokens)
        self.unknown = unknown
        self._index = {c: i for i, c in enumerate(tokens)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (unknown characters become ``unknown``)."""
        fallback = self._index[self.unknown]
        return [self._index.get(c, fallback) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""
        return "".join(self.vocab[int(i)] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "characters", "tokens": list(self.vocab),
                           "unknown": self.unknown}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> CharacterTokenizer:
        data = json.loads(text)
        return cls(data["tokens"], data.get("unknown", " "))


class TextTokenizer:
    """Either stored kind behind one face: ``encode(text) -> ids``, ``decode(ids) -> text``."""

    def __init__(self, kind: str, inner: Any) -> None:
        self.kind = kind
        self.inner = inner

    @property
    def vocab_size(self) -> int:
        if self.kind == "characters":
            return self.inner.vocab_size
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        if self.kind == "characters":
            return self.inner.encode(text)
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        if self.kind == "characters":
            return self.inner.decode(ids)
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=True)


def encode_tokenizer(tokenizer: Any) -> tuple[str, str, bytes]:
    """``(kind, file name, bytes)`` to store ``tokenizer``, or ``ValueError`` naming the fix."""
    if isinstance(tokenizer, CharacterTokenizer):
        return "characters", _FILES["characters"], tokenizer.to_json().encode("utf-8")
    if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "to_str"):
        return "tokenizers", _FILES["tokenizers"], tokenizer.to_str().encode("utf-8")
    raise InputError(
        f"tokenizer is a {type(tokenizer).__name__}; the registry stores a tokenizers.Tokenizer "
        "(saved as its tokenizer.json) or a CharacterTokenizer (a vocabulary), never a pickled "
        "object. Fix: pass tokenizers.Tokenizer.from_file('tokenizer.json') (for a transformers "
        "tokenizer: its .backend_tokenizer), or CharacterTokenizer(vocab).")


def decode_tokenizer(kind: str, data: bytes) -> TextTokenizer:
    """The stored tokenizer of ``kind`` from its bytes."""
    text = data.decode("utf-8")
    if kind == "characters":
        return TextTokenizer(kind, CharacterTokenizer.from_json(text))
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        return TextTokenizer(kind, Tokenizer.from_str(text))
    raise InputError(f"unknown tokenizer kind {kind!r}; this version reads {sorted(_FILES)}.")


def check_processing(processing: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """The processing spec with its defaults, or ``ValueError`` naming the field and the fix.

    Keys: ``task`` ("text-generation"), ``max_tokens`` (default new tokens per request, 16),
    ``max_context`` (most tokens the model sees; longer prompts keep their end, default
    unlimited), ``temperature`` (0 = greedy, the default), ``eos_token_id`` (stops a
    continuation; default none), ``max_tokens_limit`` (most a request may ask, default 1024).
    """
    if not isinstance(processing, Mapping):
        raise InputError(f"processing must be a dict, got {type(processing).__name__}.")
    known = {"task", "max_tokens", "max_context", "temperature", "eos_token_id",
             "max_tokens_limit"}
    unknown = sorted(set(processing) - known)
    if unknown:
        raise InputError(f"processing has unknown keys {unknown}; it takes {sorted(known)}.")
    spec = {"task": "text-generation", "max_tokens": 16, "max_context": None,
            "temperature": 0.0, "eos_token_id": None, "max_tokens_limit": 1024,
            **dict(processing)}
    if spec["task"] not in TASKS:
        raise InputError(f"processing['task']={spec['task']!r} is not supported. Fix: use one "
                         f"of {list(TASKS)}.")
    for key, low in (("max_tokens", 1), ("max_tokens_limit", 1)):
        _int(key, spec[key], low)
    if spec["max_context"] is not None:
        _int("max_context", spec["max_context"], 1)
    if spec["eos_token_id"] is not None:
        _int("eos_token_id", spec["eos_token_id"], 0)
        if spec["eos_token_id"] >= vocab_size:
            raise InputError(f"processing['eos_token_id']={spec['eos_token_id']} is not a token "
                             f"of the tokenizer (vocab size {vocab_size}).")
    temperature = spec["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not 0 <= temperature <= 100:
        raise InputError(f"processing['temperature']={temperature!r} must be a number in "
                         "[0, 100] (0 = greedy).")
    spec["temperature"] = float(temperature)
    if spec["max_tokens"] > spec["max_tokens_limit"]:
        raise InputError(f"processing['max_tokens']={spec['max_tokens']} exceeds "
                         f"max_tokens_limit={spec['max_tokens_limit']}.")
    return spec


def _int(key: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"processing[{key!r}]={value!r} must be an integer >= {low}.")
