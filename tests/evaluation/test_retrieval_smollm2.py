"""Tier 2: retrieval samples with the real SmolLM2-135M tokenizer and model."""

from __future__ import annotations

import pytest

from kvtuner import ModelFingerprint
from kvtuner.evaluation import parse_uniform
from kvtuner.evaluation.retrieval import (
    TASKS,
    RetrievalSettings,
    SampleKey,
    evaluate_retrieval,
    make_sample,
)
from kvtuner.evaluation.retrieval.samples import answer_counts

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("task", TASKS)
def test_chat_template_samples_are_exact(smollm2, task):
    _, tokenizer = smollm2
    s = make_sample(tokenizer, SampleKey(task, "wikitext", 4096, 0.4, 0))
    assert len(s.ids) == 4096
    assert s.text.startswith("<|im_start|>system") and "<|im_start|>assistant" in s.text
    assert answer_counts(s.text, s.draw.answers) == s.draw.answer_counts
    assert abs(s.prompt.depth_of(0) - 0.4) < 0.02  # WikiText sentences are ~30 tokens


def test_passkey_answers_through_the_packed_cache(smollm2):
    """Raw prompts (SmolLM2-135M does not answer through its chat template; see
    docs/long_context.md): fp and KV8 find every 512-token pass key."""
    model, tokenizer = smollm2
    settings = RetrievalSettings(
        "passkey", (512,), depths=(0.1, 0.9), samples=1, residual_length=32, chat=False
    )
    kv8 = parse_uniform("kv8", ModelFingerprint.from_config(model.config))
    report = evaluate_retrieval(model, tokenizer, kv8, settings, progress=False)
    acc = {r["config"]: r["accuracy"] for r in report["rows"]}
    assert acc == {"fp": 1.0, "kv8": 1.0}, report["records"]
    kv = {r["config"]: r["kv_bytes"] for r in report["rows"]}
    assert kv["kv8"] < 0.7 * kv["fp"]
