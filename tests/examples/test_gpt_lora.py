"""examples/gpt_lora end to end at tiny size, run the way a user runs it (a subprocess).

One run covers the whole story: pretraining lowers the loss, the fine-tune inherits the
registered base (its loss on the new text starts from the base's, not from scratch) and
lowers it further, the merged revision records its base in lineage, and the endpoint's
answer over HTTP is exactly what the registered model generates for the same prompts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from michelangelo.lib.model_registry import ModelRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "gpt_lora", "workflow.py")


def run_example(*args: str, timeout: float = 1500) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def result_of(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in the example's output:\n{output[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    # Module-scoped: the autouse storage fixture is per test, so give the run its own root.
    storage = tmp_path_factory.mktemp("gpt_lora") / "uniflow"
    previous = os.environ.get("UF_STORAGE_URL")
    os.environ["UF_STORAGE_URL"] = str(storage)
    try:
        code, output = run_example("--size", "tiny")
    finally:
        if previous is None:
            os.environ.pop("UF_STORAGE_URL", None)
        else:
            os.environ["UF_STORAGE_URL"] = previous
    assert code == 0, output[-6000:]
    return result_of(output), output, ModelRegistry(str(storage / "model_registry"))


def test_losses_fall_and_the_fine_tune_starts_from_the_base(tiny_run):
    report, output, _ = tiny_run
    pre, tuned = report["pretrain"], report["finetune"]
    assert pre["val_loss"] < pre["init_val_loss"] - 0.3, pre
    # Inherited: the fine-tune is measured against the registered base, and beats it.
    assert tuned["val_loss"] < tuned["base_val_loss"] - 0.01, tuned
    assert "memory preflight:" in output and "global batch size 64" in output
    assert pre["global_batch_size"] == tuned["global_batch_size"] == 64


def test_registered_revisions_carry_lineage_and_merged_weights(tiny_run):
    report, _, registry = tiny_run
    base = registry.get(report["pretrain"]["spec"])
    tuned = registry.get(report["finetune"]["spec"])
    assert tuned.lineage["baseline_model"] == report["pretrain"]["spec"]
    assert tuned.tags["adapters"] == "merged"
    assert tuned.factory["qualname"] == base.factory["qualname"] == "create_causal_lm"
    # Each revision carries its tokenizer (as data) and how to serve text.
    assert tuned.tokenizer["kind"] == base.tokenizer["kind"] == "characters"
    assert tuned.processing["task"] == "text-generation"
    assert registry.load_tokenizer(tuned.spec).encode("keeper") == \
        registry.load_tokenizer(base.spec).encode("keeper")
    weights = registry.load_state_dict(tuned.spec)
    assert not [k for k in weights if "lora" in k], "adapters were not merged"
    assert weights.keys() == registry.load_state_dict(base.spec).keys()


def test_endpoint_answers_with_what_the_registered_model_generates(tiny_run):
    report, _, registry = tiny_run
    import torch

    endpoint = report["endpoint"]
    assert endpoint["url"].startswith("http://127.0.0.1:")
    spec = report["finetune"]["spec"]
    model = registry.load_model(spec)
    tokenizer = registry.load_tokenizer(spec)
    processing = registry.get(spec).processing
    for prompt, answer in endpoint["continuations"].items():
        ids = tokenizer.encode(prompt)
        for _ in range(processing["max_tokens"]):  # greedy, over the last max_context ids
            with torch.no_grad():
                logits = model(torch.tensor([ids[-processing["max_context"]:]]))["logits"]
            ids.append(int(logits[0, -1].argmax()))
        assert answer == tokenizer.decode(ids[len(tokenizer.encode(prompt)):]), prompt
    first = next(iter(endpoint["continuations"]))
    assert "".join(endpoint["streamed"]) == endpoint["continuations"][first]
    assert len(endpoint["streamed"]) == processing["max_tokens"]  # one event per character


def test_bad_options_fail_before_any_cluster_starts():
    # The workflow body checks its arguments before calling any task, so nothing starts
    # (as `michelangelo run examples/gpt_lora/workflow.py:gpt_lora --arg size=huge` calls it).
    spec = importlib.util.spec_from_file_location("gpt_lora_workflow_for_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match=r"size='huge' is not one of"):
        module.gpt_lora.fn(size="huge")
    with pytest.raises(ValueError, match=r"strategy='deepspeed' is not one of"):
        module.gpt_lora.fn(size="tiny", strategy="deepspeed")
    # The schedule: linear warmup to the peak, cosine decay to 10% at the last step.
    schedule = module.WarmupCosine(100)
    assert schedule(0) == pytest.approx(0.1) and schedule(9) == pytest.approx(1.0)
    assert schedule(99) == pytest.approx(0.1, abs=1e-3)
    assert all(schedule(i) >= schedule(i + 1) for i in range(10, 99))


def test_the_run_record_says_where_the_time_went(tiny_run):
    from michelangelo.uniflow.core import task_phases, task_usage
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    _, _, registry = tiny_run
    store = RunStore(Storage(os.path.dirname(str(registry.url).rstrip("/"))))
    run = store.list_runs()[0]
    phases = {t.task_name: [name for name, _ in task_phases(t)]
              for t in store.load_tasks(run.run_id)}
    # The first RayTask starts the run's cluster, the next ones attach to it.
    assert phases["pretrain"][0] == "cluster start", phases
    assert phases["finetune"][0] == phases["serve"][0] == "cluster attach", phases
    for training in ("pretrain", "finetune"):
        assert phases[training][1:] == ["Ray Train start", "model and data", "fit",
                                        "checkpoint and shutdown"], phases
    assert phases["serve"][1:] == ["Serve start", "replicas ready"], phases
    for task in store.load_tasks(run.run_id):
        usage = task_usage(task)
        assert usage.cpu_h > 0 and usage.memory_gib_h > 0 and usage.held_s > 0, task.call_id
