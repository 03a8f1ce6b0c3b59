"""Uniform baseline names -> layer specs; EvalConfig validation."""

from __future__ import annotations

import pytest

from kvtuner import KVTunerError, ModelFingerprint, QuantSpec
from kvtuner.evaluation import EvalConfig, parse_uniform, uniform_specs

FP = ModelFingerprint("LlamaForCausalLM", 3, 2, 64)


@pytest.mark.parametrize(
    "name,k,v",
    [
        ("kv8", QuantSpec(8), QuantSpec(8)),
        ("KV4", QuantSpec(4), QuantSpec(4)),
        ("k8v4", QuantSpec(8), QuantSpec(4)),
        ("k4v2", QuantSpec(4), QuantSpec(2)),
        ("kivi4", QuantSpec(4, axis="channel"), QuantSpec(4)),
        ("kivi-k4v2", QuantSpec(4, axis="channel"), QuantSpec(2)),
        ("had-kv4", QuantSpec(4, rotation="hadamard"), QuantSpec(4, rotation="hadamard")),
        ("hadk-kv4", QuantSpec(4, rotation="hadamard"), QuantSpec(4)),
        ("hadv-k5v3", QuantSpec(5), QuantSpec(3, rotation="hadamard")),
        ("kivi-hadv-kv4", QuantSpec(4, axis="channel"), QuantSpec(4, rotation="hadamard")),
        (
            "kivi-had-k4v3",
            QuantSpec(4, axis="channel", rotation="hadamard"),
            QuantSpec(3, rotation="hadamard"),
        ),
        ("k16v4", QuantSpec(16), QuantSpec(4)),
        ("kivi-prerope-kv4", QuantSpec(4, axis="channel", pre_rope=True), QuantSpec(4)),
        (
            "kivi-prerope-k4v3-g64",
            QuantSpec(4, 64, axis="channel", pre_rope=True),
            QuantSpec(3, 64),
        ),
        ("kv4-g64", QuantSpec(4, 64), QuantSpec(4, 64)),
        ("k5v4-gh", QuantSpec(5, 64), QuantSpec(4, 64)),  # FP's head_dim: one group a row
        (
            "had-kv4-gh",
            QuantSpec(4, 64, rotation="hadamard"),
            QuantSpec(4, 64, rotation="hadamard"),
        ),
        (
            "kivi-prerope-hadv-k16v3",
            QuantSpec(16),  # 16 bits: stored as the model gives it
            QuantSpec(3, rotation="hadamard"),
        ),
    ],
)
def test_uniform_names_map_to_documented_specs(name, k, v):
    specs = uniform_specs(name, FP)
    assert [s.layer for s in specs] == [0, 1, 2]
    assert all(s.k == k and s.v == v for s in specs)


@pytest.mark.parametrize(
    "name",
    [
        "kv7",
        "kvx",
        "q4",
        "kivi",
        "had-kivi4",
        "hadv-kivi4",
        "hadq-kv4",
        "kv32",
        "prerope-kivi4",
        "kv4-g",
        "kv4-g0",
        "kv4-gx",
        "kv4g64",
    ],
)
def test_unknown_uniform_names_are_one_line_errors(name):
    with pytest.raises(KVTunerError) as info:
        uniform_specs(name, FP)
    assert "\n" not in str(info.value)


def test_parse_uniform_splits_commas_keeps_order_and_drops_repeats():
    configs = parse_uniform(["kv8, kv4", "kv8,kivi2"], FP)
    assert [c.name for c in configs] == ["kv8", "kv4", "kivi2"]
    assert all(c.kind == "uniform" for c in configs)


def test_accounting_matches_the_profile_rules():
    kv4 = parse_uniform("kv4", FP)[0].accounting(FP)
    assert kv4["nominal_bits"] == 4 and kv4["effective_bits"] == 5.0  # + fp16 scale/zero per 32
    assert EvalConfig("fp", "fp").accounting(FP)["bytes_per_token"] == 3 * 2 * 64 * 2 * 2


def test_eval_config_rejects_inconsistent_rows():
    with pytest.raises(KVTunerError):
        EvalConfig("x", "uniform")
    with pytest.raises(KVTunerError):
        EvalConfig("x", "hf-quanto", quanto_bits=8)
    with pytest.raises(KVTunerError):
        EvalConfig("x", "nonsense")


def test_format_v2_widths_name_uniform_configs():
    fp = ModelFingerprint("LlamaForCausalLM", 2, 2, 64)
    (kv3, k5v3) = parse_uniform("kv3,kivi-k5v3", fp)
    assert {(s.k.bits, s.v.bits) for s in kv3.specs} == {(3, 3)}
    assert k5v3.specs[0].k.axis == "channel" and k5v3.specs[0].k.bits == 5
    assert kv3.accounting(fp)["effective_bits"] == 4.0  # 3 + fp16 scale/zero per 32
    assert kv3.specs_hash(fp) != k5v3.specs_hash(fp) and kv3.specs_hash(fp) is not None
