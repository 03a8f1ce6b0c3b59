"""Budget arithmetic: nominal bits and bytes vs fp16 (scales and zeros included), exact."""

from fractions import Fraction

import pytest

from kvtuner import KVTunerError, LayerSpec, ModelFingerprint, Profile, QuantSpec
from kvtuner.tuner import Budget

FP = ModelFingerprint("LlamaForCausalLM", num_layers=4, num_kv_heads=3, head_dim=64)


def specs(*pairs, group=32):
    pairs = enumerate(pairs)
    return [LayerSpec(i, QuantSpec(k, group), QuantSpec(v, group)) for i, (k, v) in pairs]


@pytest.mark.parametrize(
    "text,kind,value",
    [
        ("4bit", "bits", 4),
        ("3.5bits", "bits", Fraction(7, 2)),
        ("2.5 bit", "bits", Fraction(5, 2)),
        ("0.30x", "ratio", Fraction(3, 10)),
        (".25x", "ratio", Fraction(1, 4)),
        ("1x", "ratio", 1),
    ],
)
def test_parse(text, kind, value):
    b = Budget.parse(text)
    assert (b.kind, b.value) == (kind, value)
    assert Budget.parse(b.label) == b


@pytest.mark.parametrize(
    "text",
    ["", "4", "four bits", "4bytes", "-1bit", "0bit", "17bit", "1.5x", "0x", "0.3xx", "3.5.1bits"],
)
def test_bad_forms_are_one_line_errors(text):
    with pytest.raises(KVTunerError) as exc:
        Budget.parse(text)
    assert "\n" not in str(exc.value)


def test_nominal_bits_is_mean_of_k_and_v_bits():
    b = Budget.parse("4bit")
    mixed = specs((8, 4), (4, 2), (2, 2), (8, 2))  # sum 32 = 4 bits x 2 x 4 layers
    assert b.cost(mixed, FP) == 32 == b.capacity(FP)
    assert b.fits(mixed, FP)
    assert not b.fits(specs((8, 4), (4, 2), (2, 2), (4, 8)), FP)
    assert Budget.parse("3.5bits").capacity(FP) == 28


def test_ratio_counts_scales_and_zeros_like_the_profile():
    layers = specs((4, 4), (4, 4), (2, 2), (16, 8))
    profile = Profile("m", FP, tuple(layers))
    cost = Budget.parse("1x").cost(layers, FP)
    assert float(cost) == pytest.approx(profile.bytes_per_token)
    # 4-bit g32 asym row on head_dim 64: 32 code bytes + 2 groups x (scale + zero) x 2 bytes = 40
    assert Budget.parse("1x").layer_cost(layers[0], FP) == 3 * (40 + 40)
    ratio = Fraction(profile.bytes_per_token).limit_denominator() / profile.fp16_bytes_per_token
    assert Budget("ratio", ratio).fits(layers, FP)
    assert not Budget("ratio", ratio - Fraction(1, 10_000)).fits(layers, FP)


def test_channel_axis_bytes_are_exact_fractions():
    k = QuantSpec(2, 32, axis="channel")  # block: 32 tokens x 16 code bytes + 64 x 4 meta bytes
    spec = LayerSpec(0, k, QuantSpec(2, 32))
    assert Budget.parse("1x").layer_cost(spec, FP) == 3 * (Fraction(32 * 16 + 64 * 4, 32) + 24)


def test_scaled_keeps_kind():
    assert Budget.parse("4bit").scaled(Fraction(9, 10)) == Budget("bits", Fraction(18, 5))


HYBRID = ModelFingerprint(
    "Gemma3ForCausalLM",
    4,
    1,
    64,
    layer_types=("sliding_attention",) * 3 + ("full_attention",),
    sliding_window=9,
)


def test_window_layers_weigh_by_their_capped_tokens_at_the_context():
    at_80 = Budget.parse("4bit").at_context(HYBRID, 80)
    assert at_80.to_dict()["context_length"] == 80
    # window layers hold 8 of 80 tokens: weight 1/10 each, the global layer 1
    assert at_80.capacity(HYBRID) == 4 * 2 * (Fraction(3, 10) + 1)
    cheap_windows = specs((2, 2), (2, 2), (2, 2), (8, 8))
    assert at_80.cost(cheap_windows, HYBRID) == Fraction(12, 10) + 16
    assert not at_80.fits(cheap_windows, HYBRID)  # 17.2 > 10.4
    assert at_80.fits(specs((8, 8), (8, 8), (8, 8), (2, 2)), HYBRID)  # 4.8 + 4 <= 10.4
    ratio = Budget.parse("0.5x").at_context(HYBRID, 80)
    assert ratio.capacity(HYBRID) == Fraction(1, 2) * 256 * Fraction(13, 10)  # fp16 same layout
    assert Budget.parse("4bit").at_context(FP, 80) == Budget.parse("4bit")  # no windows: no-op


def test_profile_accounting_matches_the_budget_at_its_context():
    layers = tuple(specs((8, 8), (8, 8), (8, 8), (2, 2)))
    budget = Budget.parse("4bit").at_context(HYBRID, 80)
    profile = Profile("m", HYBRID, layers).with_accounting(**budget.to_dict())
    assert profile.context_length == 80
    assert profile.nominal_bits == pytest.approx(float(budget.cost(layers, HYBRID)) / 2 / 1.3)
    per_token = float(Budget.parse("1x").at_context(HYBRID, 80).cost(layers, HYBRID))
    assert profile.bytes_per_token == pytest.approx(per_token)
    assert profile.kv_bytes(80) == pytest.approx(per_token * 80)
    assert profile.fp16_bytes_per_token == pytest.approx(256 * 1.3)
