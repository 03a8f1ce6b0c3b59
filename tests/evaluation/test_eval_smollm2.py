"""Tier 2: the real SmolLM2-135M through the packed cache (generation, perplexity, CLI)."""

from __future__ import annotations

import json

import pytest

import kvtuner
from kvtuner import ModelFingerprint, Profile
from kvtuner.cli.main import main
from kvtuner.evaluation import EvalConfig, load_eval_windows, parse_uniform, perplexity
from kvtuner.evaluation.data import SHARED_TEST_FILE
from kvtuner.evaluation.generation import generate_text

pytestmark = pytest.mark.slow
needs_data = pytest.mark.skipif(not SHARED_TEST_FILE.is_file(), reason="no WikiText-2 test file")


def uniform_profile(model, name: str) -> Profile:
    fp = ModelFingerprint.from_config(model.config)
    spec = parse_uniform(name, fp)[0].specs[0]
    return Profile.uniform("smollm2-135m", fp, spec.k, spec.v)


@pytest.mark.parametrize("name,residual", [("had-kv4", 0), ("kivi4", 8)])
def test_4bit_profile_generates_a_fluent_answer(smollm2, name, residual):
    model, tokenizer = smollm2
    done = generate_text(
        model,
        tokenizer,
        "What is the capital of France?",
        uniform_profile(model, name),
        max_new_tokens=12,
        residual_length=residual,
    )
    assert "The capital of France is Paris" in done.text
    assert done.kv_bytes < 0.6 * done.fp16_bytes  # most of the 48 cached tokens are packed


def test_static_cache_generates_the_same_fluent_answer(smollm2):
    model, tokenizer = smollm2
    kw = dict(max_new_tokens=12, residual_length=0, pack_chunk=1)
    profile = uniform_profile(model, "had-kv4")
    dynamic = generate_text(model, tokenizer, "What is the capital of France?", profile, **kw)
    done = generate_text(model, tokenizer, "What is the capital of France?", profile,
                         max_new_tokens=12, static=True)  # fmt: skip
    assert done.text == dynamic.text and "The capital of France is Paris" in done.text
    slots = done.prompt_tokens + 12  # every slot held, against fp16 of as many tokens
    assert done.kv_bytes == profile.kv_bytes(slots)
    assert done.kv_bytes / done.fp16_bytes == 40 / 128  # 4-bit rows of d 64: 32 B + 2 groups


@needs_data
def test_8bit_perplexity_within_half_a_percent_of_fp(smollm2):
    model, tokenizer = smollm2
    windows = load_eval_windows(tokenizer, num_windows=2, seq_len=256)
    assert windows.tokens.shape == (2, 256)
    fp = perplexity(model, windows.tokens, EvalConfig("fp", "fp"))
    kv8 = perplexity(
        model, windows.tokens, parse_uniform("kv8", ModelFingerprint.from_config(model.config))[0]
    )
    assert 5 < fp.ppl < 100
    assert abs(kv8.delta_pct(fp)) < 0.5
    assert kv8.window_nll != fp.window_nll  # it did quantize


@needs_data
def test_eval_cli_end_to_end_prints_what_the_keyword_verb_returns(smollm2, tmp_path, capsys):
    """One CLI run (it loads the model itself) against kvtuner.evaluate on the session's copy."""
    verb_json, cli_json = tmp_path / "verb.json", tmp_path / "cli.json"
    outcome = kvtuner.evaluate(
        model="smollm2-135m",
        uniform=["kv8", "kv2"],
        num_windows=1,
        seq_len=256,
        decode_speed=False,
        hf_quanto="off",
        output=verb_json,
        loaded=smollm2,  # the session's copy of what the CLI loads (one GGUF load less)
    )
    argv = ["eval", "--model", "smollm2-135m", "--uniform", "kv8,kv2", "--num-windows", "1",
            "--seq-len", "256", "--no-decode", "--hf-quanto", "off", "--output", str(cli_json),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    (result,) = outcome.results
    table = result.table.splitlines()
    # line 2 holds the wall time; the model line, the header and every row are the same
    assert printed[0] == table[0] and printed[2:-1] == table[2:]
    assert [line.split()[0] for line in table[4:]] == ["fp", "kv8", "kv2"]
    assert printed[-1] == f"wrote {cli_json}" and outcome.written == [verb_json]
    cli_rows = {r["name"]: r for r in json.loads(cli_json.read_text())["rows"]}
    assert cli_rows["kv2"]["delta_ppl_pct"] > 10 * abs(cli_rows["kv8"]["delta_ppl_pct"])
    # as JSON text: one window leaves the standard errors NaN, which equals nothing
    rows = [json.dumps(json.loads(p.read_text())["rows"]) for p in (verb_json, cli_json)]
    assert rows[0] == rows[1] == json.dumps(result.report.rows)
