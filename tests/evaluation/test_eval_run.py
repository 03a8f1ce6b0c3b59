"""evaluate_configs(), perplexity() and the report on a tiny in-process model: protocol, bytes,
table, JSON, plot."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kvtuner import ModelFingerprint
from kvtuner.evaluation import (
    DecodeSettings,
    EvalConfig,
    EvalWindows,
    evaluate_configs,
    format_markdown,
    format_table,
    parse_uniform,
    perplexity,
    plot_report,
    write_report,
)
from kvtuner.evaluation.quanto import quanto_missing


def windows(n: int = 2, t: int = 64) -> EvalWindows:
    gen = torch.Generator().manual_seed(3)
    return EvalWindows("synthetic", n, t, torch.randint(0, 256, (n, t), generator=gen))


def configs(model, names: str) -> list[EvalConfig]:
    return parse_uniform(names, ModelFingerprint.from_config(model.config))


def test_fp_perplexity_is_the_models_own_loss(tiny_llama):
    w = windows(1)
    with torch.no_grad():
        loss = tiny_llama(w.tokens, labels=w.tokens).loss.item()
    res = perplexity(tiny_llama, w.tokens, EvalConfig("fp", "fp"))
    assert res.ppl == pytest.approx(math.exp(loss), rel=1e-5)


def test_16bit_rows_equal_fp_and_fewer_bits_hurt_more(tiny_llama):
    w = windows()
    fp = perplexity(tiny_llama, w.tokens, EvalConfig("fp", "fp"))
    res = {c.name: perplexity(tiny_llama, w.tokens, c) for c in configs(tiny_llama, "kv16,kv8,kv2")}
    assert res["kv16"].window_nll == fp.window_nll
    # 8 bits moves each window's NLL (~1e-6 relative on this tiny model: their sum, and so the
    # ppl, can come out equal to fp's in fp32), 2 bits far more
    assert res["kv8"].window_nll != fp.window_nll
    assert abs(res["kv2"].delta_pct(fp)) > 5 * abs(res["kv8"].delta_pct(fp))
    assert abs(res["kv2"].delta_pct(fp)) > 0.1


def test_evaluate_reports_measured_bytes_and_decode_speed(tiny_llama, tmp_path):
    rows = configs(tiny_llama, "kv8,k4v2,kivi2")
    decode = DecodeSettings(prompt_tokens=40, steps=4, repeats=1, residual_length=8)
    report = evaluate_configs(tiny_llama, windows(), rows, model_name="tiny", decode=decode)
    by_name = {r["name"]: r for r in report.rows}
    assert list(by_name) == ["fp", "kv8", "k4v2", "kivi2"]
    fingerprint = ModelFingerprint.from_config(tiny_llama.config)
    for c in rows:  # measured on the cache == the profile's prediction (64 tokens: aligned)
        assert by_name[c.name]["bytes_per_token"] == c.accounting(fingerprint)["bytes_per_token"]
    assert by_name["fp"]["delta_ppl_pct"] == 0 and by_name["kivi2"]["delta_ppl_pct"] != 0
    assert all(r["decode_tok_s"] > 0 and r["decode_ratio"] > 0 for r in report.rows)
    assert all(by_name[c.name]["decode_ratio_copy"] > 0 for c in rows)  # both packed modes
    table = format_table(report)
    assert "kivi2" in table and "copy tok/s" in table
    assert format_markdown(report).count("\n| kivi2 |") == 1
    data = json.loads(write_report(report, tmp_path / "r.json").read_text())
    assert data["format"] == "kvtuner-eval" and len(data["rows"]) == 4
    assert data["hardware"]["torch_threads"] >= 1
    pytest.importorskip("matplotlib")
    assert plot_report(report, tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(quanto_missing() is not None, reason="optimum-quanto not importable")
def test_hf_quanto_peer_quantizes_the_prefill_and_stores_fewer_bytes(tiny_llama):
    rows = [EvalConfig("hf-quanto4", "hf-quanto", quanto_bits=4)]
    report = evaluate_configs(
        tiny_llama, windows(), rows, decode=DecodeSettings(prompt_tokens=40, steps=3, repeats=1)
    )
    fp, q = report.rows
    assert q["delta_ppl_pct"] != 0
    assert q["bytes_per_token"] < fp["bytes_per_token"] / 2
