"""Text models in process: the tokenizer stored with the revision, batching of prompts of
different lengths, generate parameters and their errors (HTTP is in test_serving_endpoint)."""

import asyncio
import json

import numpy as np
import pytest
import serving_models
import torch

from michelangelo.lib.model_registry import CharacterTokenizer, ModelRegistry
from michelangelo.lib.serving._binary import render
from michelangelo.lib.serving._errors import BadRequest, HTTPError
from michelangelo.lib.serving._model import ServedModel
from michelangelo.lib.serving._routes import Routes
from michelangelo.lib.serving._text import TextModel

PROMPTS = ["a", "the keeper wrote", "fog in the bay, light lit", "hello there"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    registry = ModelRegistry(str(root))
    spec = serving_models.register_text_model(registry)
    torch.set_num_threads(1)
    served = ServedModel.load(registry.url, spec)
    return registry, spec, TextModel(served, served.tokenizer, served.processing), root


def _greedy_alone(model, tokenizer, prompt, steps, context=32):
    """The reference: one prompt, no padding, no batching."""
    ids = tokenizer.encode(prompt)
    for _ in range(steps):
        with torch.inference_mode():
            logits = model(torch.tensor([ids[-context:]]))["logits"][0, -1]
        ids.append(int(logits.argmax()))
    return tokenizer.decode(ids[len(tokenizer.encode(prompt)):])


def test_the_tokenizer_is_stored_as_data_and_verified(text):
    registry, spec, _, root = text
    revision = registry.get(spec)
    assert revision.tokenizer["kind"] == "characters" and revision.tokenizer["file"] == "vocab.json"
    assert revision.processing["max_tokens"] == 8 and revision.processing["temperature"] == 0.0
    (stored,) = root.rglob("vocab.json")
    assert json.loads(stored.read_text(encoding="utf-8"))["tokens"][1] == "a"
    tokenizer = registry.load_tokenizer(spec)
    assert tokenizer.decode(tokenizer.encode("fog, bay!")) == "fog, bay!"
    with open(stored, "a", encoding="utf-8") as handle:  # tampered: refused
        handle.write(" ")
    with pytest.raises(Exception, match="sha256"):
        registry.load_tokenizer(spec)
    with open(stored, "rb+") as handle:
        handle.truncate(len(handle.read()) - 1)
    assert registry.load_tokenizer(spec).encode("ab") == [1, 2]


def test_tokenizers_library_json_round_trips(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "there": 2, "fog": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    registry = ModelRegistry(str(tmp_path))
    model = torch.nn.Embedding(4, 2)
    spec = registry.register("p", "m", model=model, tokenizer=tok)
    loaded = registry.load_tokenizer(spec)
    assert loaded.kind == "tokenizers" and loaded.encode("hello fog") == [1, 3]
    assert registry.get(spec).tokenizer["file"] == "tokenizer.json"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"tokenizer": object()}, "never a pickled object"),
    ({"processing": {"task": "text-generation"}}, "processing needs tokenizer="),
    ({"tokenizer": CharacterTokenizer("ab "), "processing": {"task": "translate"},
      "input_example": torch.tensor([[0, 1]])}, "task"),
    ({"tokenizer": CharacterTokenizer("ab "), "processing": {"max_tokens": 0},
      "input_example": torch.tensor([[0, 1]])}, "max_tokens"),
    ({"tokenizer": CharacterTokenizer("ab "), "processing": {"eos_token_id": 9},
      "input_example": torch.tensor([[0, 1]])}, "eos_token_id"),
])
def test_bad_tokenizer_or_processing_is_refused_before_anything_is_written(tmp_path, kwargs,
                                                                           fragment):
    registry = ModelRegistry(str(tmp_path))
    with pytest.raises(ValueError, match=fragment):
        registry.register("p", "m", model=torch.nn.Embedding(3, 3), **kwargs)
    assert registry.projects() == []


def test_prompts_of_different_lengths_batch_to_exactly_their_own_continuations(text):
    model = text[2]
    tokenizer = model.tokenizer
    rows = model.prepare({"text_input": np.array([p.encode() for p in PROMPTS], dtype=object)})
    together = [t.decode() for t in model.forward(rows)["text_output"]]
    # Several requests merged in one decoding loop, as dynamic batching does.
    split = model.forward_many([model.prepare({"text_input": np.array([p.encode()],
                                                                      dtype=object)})
                                for p in PROMPTS])
    assert [s["text_output"][0].decode() for s in split] == together
    for prompt, got in zip(PROMPTS, together, strict=True):
        assert got == _greedy_alone(model.served.model, tokenizer, prompt, 8), prompt
        assert len(got) == 8
    assert len(set(together)) > 1  # a model that ignored its prompt would pass trivially


def test_streamed_chunks_make_the_same_continuation(text):
    model = text[2]
    params = model.parameters({"max_tokens": 12})
    chunks = list(model.stream("the keeper wrote", params))
    assert len(chunks) == 12 and "".join(chunks) == _greedy_alone(
        model.served.model, model.tokenizer, "the keeper wrote", 12)


def _call(routes, path, body):
    async def read():
        return json.dumps(body).encode()

    async def run():
        try:
            answer = await routes.handle("POST", path, read, {})
        except HTTPError as exc:
            return exc.status, json.loads(render(exc.body())[0])
        if answer.stream is not None:
            return answer.status, [e async for e in answer.stream]
        return answer.status, json.loads(render(answer.body)[0])

    return asyncio.run(run())


def test_routes_take_text_and_check_generate_parameters(text):
    model = text[2]

    async def predict(arrays):
        return model.forward(model.prepare(arrays))

    routes = Routes("chars", model.info, model.signature, predict, text=model)
    status, body = _call(routes, "/", {"inputs": ["hello", "a"]})
    assert status == 200 and len(body["predictions"]) == 2
    status, body = _call(routes, "/v2/models/chars/generate",
                         {"text_input": "hello", "parameters": {"max_tokens": 3}})
    assert status == 200 and body["text_output"] == body["text_output"][:3]
    assert len(body["text_output"]) == 3 and body["model_name"] == "chars"
    status, events = _call(routes, "/v2/models/chars/generate_stream",
                           {"text_input": "hello", "parameters": {"max_tokens": 3}})
    assert status == 200 and len(events) == 3
    assert all(e.startswith(b"data: {") and e.endswith(b"\n\n") for e in events)
    assert "".join(json.loads(e[6:])["text_output"] for e in events) == body["text_output"]
    for bad, fragment in [({"text_input": 3}, "text_input"),
                          ({"text_input": ""}, "empty"),
                          ({"text_input": "a", "parameters": {"max_tokens": 0}}, "max_tokens"),
                          ({"text_input": "a", "parameters": {"max_tokens": 99999}}, "1024"),
                          ({"text_input": "a", "parameters": {"temperature": -1}}, "temperature"),
                          ({"text_input": "a", "parameters": {"top_q": 1}}, "top_q"),
                          ({"text_input": "a", "parameters": []}, "JSON object")]:
        for path in ("/v2/models/chars/generate", "/v2/models/chars/generate_stream"):
            status, body = _call(routes, path, bad)
            assert status == 400 and fragment in body["error"], (bad, body)
    status, body = _call(routes, "/", {"inputs": [""]})
    assert status == 400 and "empty" in body["error"]


def test_sampling_with_a_temperature_stays_in_the_vocabulary(text):
    model = text[2]
    rows = model.prepare({"text_input": np.array([b"fog"] * 3, dtype=object),
                          "temperature": np.array([1.5, 1.5, 1.5])})
    out = [t.decode() for t in model.forward(rows)["text_output"]]
    assert all(len(t) == 8 and set(t) <= set(serving_models.TEXT_VOCAB) for t in out)


def test_a_non_text_model_has_no_generate(text):
    async def predict(arrays):
        return arrays

    sig = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}],
           "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]}
    routes = Routes("m", {"project_name": "p", "model_name": "m", "revision_id": 1,
                          "weights_sha256": "x"}, sig, predict)
    status, body = _call(routes, "/v2/models/m/generate", {"text_input": "a"})
    assert status == 404 and "not a text model" in body["error"]


def test_prompts_that_are_not_utf8_are_400(text):
    model = text[2]
    with pytest.raises(BadRequest, match=r"text_input\[1\] is not UTF-8"):
        model.prepare({"text_input": np.array([b"ok", b"\xff"], dtype=object)})


def test_a_tokenizers_library_tokenizer_serves_text_too(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "the", "keeper", "wrote", "fog", "light", "bay", "lit"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    registry = ModelRegistry(str(tmp_path))
    torch.manual_seed(1)
    spec = registry.register(
        "p", "words", model=serving_models.create_tiny_causal_lm(vocab_size=len(words)),
        create_model_fn=serving_models.create_tiny_causal_lm,
        create_model_fn_kwargs={"vocab_size": len(words)},
        input_example=torch.tensor([[1, 2, 3]]), tokenizer=tok,
        processing={"task": "text-generation", "max_tokens": 5})
    served = ServedModel.load(registry.url, spec)
    model = TextModel(served, served.tokenizer, served.processing)
    rows = model.prepare({"text_input": np.array([b"the keeper wrote", b"fog"], dtype=object)})
    out = [t.decode() for t in model.forward(rows)["text_output"]]
    assert all(set(t.split()) <= set(words[1:]) | {"[UNK]"} for t in out)
    assert len(out[0].split()) == 5
    streamed = "".join(model.stream("the keeper wrote", model.parameters({})))
    assert streamed == out[0]
