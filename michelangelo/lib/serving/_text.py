"""Text in, text out: a revision registered with a tokenizer and a text-generation spec.

The registered model takes token ids ``[batch, length]`` and returns logits ``[batch,
length, vocab]`` (a tensor, or a dict / ``ModelOutput`` with ``logits``). The endpoint
tokenizes each prompt, decodes new tokens one step at a time and answers text.

Prompts of different lengths share each forward pass: rows are right-padded, and each row
takes the logits at ITS last real position. A causal model's output at position ``t``
depends only on tokens ``0..t`` of its own row, so the padding after it changes nothing:
every request gets exactly the continuation it would get alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from michelangelo.lib.serving._errors import BadRequest, ReadinessError
from michelangelo.lib.serving._model import ServedModel, forward_rows

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
SIGNATURE = {"inputs": [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]}],
             "outputs": [{"name": TEXT_OUTPUT, "datatype": "BYTES", "shape": [-1]}]}
# Per-row generation parameters travel beside the text through dynamic batching.
_MAX_TOKENS = "max_tokens"
_TEMPERATURE = "temperature"
PARAMETERS = (_MAX_TOKENS, _TEMPERATURE)


class TextModel:
    """A :class:`ServedModel` of logits behind a tokenizer: ``forward`` maps text to text.

    Args:
        served: The loaded model (token ids in, logits out).
        tokenizer: Has ``encode(text) -> ids`` and ``decode(ids) -> text``.
        processing: The registered spec (``max_tokens``, ``max_context``, ``temperature``,
            ``eos_token_id``, ``max_tokens_limit``).
    """

    signature = SIGNATURE
    input_names = [TEXT_INPUT]

    def __init__(self, served: ServedModel, tokenizer: Any, processing: Mapping[str, Any]) -> None:
        self.served = served
        self.tokenizer = tokenizer
        self.spec = dict(processing)
        self.info = served.info
        self.output_names = [TEXT_OUTPUT]
        outputs = {o["name"]: o for o in served.signature["outputs"]}
        self._logits = "logits" if "logits" in outputs else next(iter(outputs))
        if len(outputs[self._logits]["shape"]) != 3:
            raise ReadinessError(
                f"{_name(served)} is registered for text generation, but its output "
                f"{self._logits!r} has shape {outputs[self._logits]['shape']}; the model must "
                "return logits [batch, length, vocab]. Fix: register the language model itself.")
        self._input = served.input_names[0]
        self.steps_run = 0  # decoding steps so far (a stream a client left stops adding)
        from michelangelo.lib.serving._oip import DATATYPES

        self._id_dtype = DATATYPES[served.signature["inputs"][0]["datatype"]]

    # ---- requests --------------------------------------------------------------------------

    def prepare(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows with their parameters (defaults filled in), checked before any batching."""
        texts = arrays[TEXT_INPUT].reshape(-1)
        for i, raw in enumerate(texts):
            self.prompt_ids(raw, f"text_input[{i}]")
        rows = len(texts)
        out = {TEXT_INPUT: texts,
               _MAX_TOKENS: np.full(rows, self.spec["max_tokens"], dtype=np.int64),
               _TEMPERATURE: np.full(rows, self.spec["temperature"], dtype=np.float64)}
        for key in PARAMETERS:
            if key in arrays:
                out[key] = np.asarray(arrays[key]).reshape(-1).astype(out[key].dtype)
        return out

    def prompt_ids(self, raw: Any, what: str) -> list[int]:
        """The token ids of one prompt (UTF-8 bytes or str), or :class:`BadRequest`."""
        if isinstance(raw, bytes | np.bytes_):
            try:
                raw = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(f"{what} is not UTF-8 text. Fix: send the prompt as UTF-8."
                                 ) from None
        ids = self.tokenizer.encode(str(raw))
        if not ids:
            raise BadRequest(f"{what} is empty: the model needs at least one token to continue."
                             " Fix: send a non-empty prompt.")
        return ids

    def parameters(self, given: Any) -> dict[str, Any]:
        """A generate request's ``parameters`` checked, with the registered defaults."""
        if given is None:
            given = {}
        if not isinstance(given, dict):
            raise BadRequest(f"'parameters' must be a JSON object, got {given!r:.60}.")
        known = {_MAX_TOKENS, _TEMPERATURE, "stream"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise BadRequest(f"unknown parameter(s) {unknown}; this model takes "
                             f"{sorted(known - {'stream'})}.")
        limit = self.spec["max_tokens_limit"]
        max_tokens = given.get(_MAX_TOKENS, self.spec["max_tokens"])
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) \
                or not 1 <= max_tokens <= limit:
            raise BadRequest(f"parameters.max_tokens={max_tokens!r} must be an integer from 1 "
                             f"to {limit}. Fix: e.g. \"max_tokens\": 32.")
        temperature = given.get(_TEMPERATURE, self.spec["temperature"])
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
                or not 0 <= temperature <= 100:
            raise BadRequest(f"parameters.temperature={temperature!r} must be a number from 0 "
                             "(greedy) to 100. Fix: e.g. \"temperature\": 0.7.")
        return {_MAX_TOKENS: max_tokens, _TEMPERATURE: float(temperature)}

    def generate_request(self, body: Any) -> tuple[str, dict[str, Any]]:
        """The prompt and parameters of a ``generate``/``generate_stream`` body."""
        if not isinstance(body, dict) or not isinstance(body.get(TEXT_INPUT), str):
            raise BadRequest('the body must be a JSON object with a string "text_input", e.g. '
                             '{"text_input": "Once upon a time", "parameters": {"max_tokens": '
                             f"16}}}}; got {body!r:.60}.")
        params = self.parameters(body.get("parameters"))
        self.prompt_ids(body[TEXT_INPUT], "text_input")
        return body[TEXT_INPUT], params

    # ---- generation ------------------------------------------------------------------------

    def forward(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Prepared rows (see :meth:`prepare`) to ``{"text_output": bytes per row}``."""
        texts = arrays[TEXT_INPUT]
        prompts = [self.prompt_ids(t, f"text_input[{i}]") for i, t in enumerate(texts)]
        new: list[list[int]] = [[] for _ in prompts]
        for step in self.steps(prompts, [int(m) for m in arrays[_MAX_TOKENS]],
                               [float(t) for t in arrays[_TEMPERATURE]]):
            for row, token in step.items():
                new[row].append(token)
        out = np.empty(len(prompts), dtype=object)
        for i, ids in enumerate(new):
            out[i] = self.tokenizer.decode(ids).encode("utf-8")
        return {TEXT_OUTPUT: out}

    def forward_many(self, requests: Sequence[Mapping[str, np.ndarray]]
                     ) -> list[dict[str, np.ndarray]]:
        """Several requests' prompts in one decoding loop; each gets its own rows back."""
        return forward_rows(self.forward, requests)

    def steps(self, prompts: list[list[int]], max_tokens: list[int], temperature: list[float],
              rng: np.random.Generator | None = None) -> Iterator[dict[int, int]]:
        """Decode: each step is ``{row: new token}`` for the rows still going."""
        rng = rng or np.random.default_rng()
        seqs = [list(p) for p in prompts]
        left = list(max_tokens)
        eos, context = self.spec.get("eos_token_id"), self.spec.get("max_context")
        while True:
            active = [i for i, n in enumerate(left) if n > 0]
            if not active:
                return
            rows = [seqs[i][-context:] if context else seqs[i] for i in active]
            lengths = np.array([len(r) for r in rows])
            batch = np.zeros((len(rows), int(lengths.max())), dtype=self._id_dtype)
            for j, r in enumerate(rows):
                batch[j, :len(r)] = r  # right-padded: a causal model never looks ahead
            logits = self.served.forward({self._input: batch})[self._logits]
            last = logits[np.arange(len(rows)), lengths - 1].astype(np.float64)
            step = {}
            for j, i in enumerate(active):
                token = _choose(last[j], temperature[i], rng)
                seqs[i].append(token)
                left[i] = 0 if token == eos else left[i] - 1
                step[i] = token
            self.steps_run += 1
            yield step

    def stream(self, text: str, params: Mapping[str, Any]) -> Iterator[str]:
        """The continuation of one prompt as text chunks, one per token that adds text."""
        ids: list[int] = []
        sent = ""
        for step in self.steps([self.prompt_ids(text, "text_input")], [params[_MAX_TOKENS]],
                               [params[_TEMPERATURE]]):
            ids.append(step[0])
            text_now = self.tokenizer.decode(ids)
            if text_now.endswith("\ufffd"):  # half of a multi-byte character: wait for more
                continue
            chunk, sent = text_now[len(sent):], text_now
            if chunk:
                yield chunk
        text_now = self.tokenizer.decode(ids)
        if text_now[len(sent):]:
            yield text_now[len(sent):]


def _choose(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits / temperature
    scaled -= scaled.max()
    p = np.exp(scaled)
    return int(rng.choice(len(p), p=p / p.sum()))


def _name(served: ServedModel) -> str:
    i = served.info
    return f"{i['project_name']}/{i['model_name']}:{i['revision_id']}"
