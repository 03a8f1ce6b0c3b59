"""Profile schema v1–v4: round trip, canonical hash, accounting, and every rejection case."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config

from kvtuner import KVTunerError, load_profile
from kvtuner.profile import LayerSpec, ModelFingerprint, Profile, save_profile
from kvtuner.quant import KeySmoothing, QuantSpec

FP = ModelFingerprint("LlamaForCausalLM", num_layers=2, num_kv_heads=2, head_dim=32)
K4, V2 = QuantSpec(4, 32), QuantSpec(2, 32, symmetric=True)


LAM = [[0.5 + 0.25 * (c % 4) for c in range(32)], [1.0] * 32]  # λ [2 heads, head_dim 32]


def _profile(**kw) -> Profile:
    layers = (LayerSpec(0, QuantSpec(8, 32), V2), LayerSpec(1, K4, QuantSpec(16)))
    return Profile("tiny", FP, layers, created="2026-01-01T00:00:00+00:00", **kw).with_accounting(
        asked="4bit"
    )


def _written(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_round_trip(tmp_path):
    p = _profile(metrics={"kl": 0.01}, calibration={"dataset": "wikitext-2", "seed": 0})
    path = save_profile(p, tmp_path / "sub" / "p.json")
    loaded = load_profile(path)
    assert loaded == p
    assert loaded.to_dict() == json.loads(path.read_text())
    assert not list(path.parent.glob(".*.tmp"))  # atomic write left no temp file


def test_written_profile_has_a_plain_file_mode(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        path = save_profile(_profile(), tmp_path / "p.json")
        assert path.stat().st_mode & 0o777 == 0o644  # readable by a server run as another user
        path.chmod(0o600)
        save_profile(_profile(), path)
        assert path.stat().st_mode & 0o777 == 0o600  # an existing file keeps its mode
    finally:
        os.umask(umask)


def test_version_is_the_lowest_that_holds_the_bits(tmp_path):
    assert _profile().schema_version == 1  # 2/4/8/16 only: v1 readers can still load it
    layers = (LayerSpec(0, QuantSpec(3, 32), QuantSpec(5, 32)), LayerSpec(1, K4, QuantSpec(6, 32)))
    p = Profile("tiny", FP, layers).with_accounting(asked="4.5bit")
    assert p.schema_version == 2
    assert p.bytes_per_token == 2 * (12 + 4 + 20 + 4) + 2 * (16 + 4 + 24 + 4)  # codes + fp16 s/z
    loaded = load_profile(save_profile(p, tmp_path / "v2.json"))
    assert loaded == p
    assert Profile("tiny", FP, _profile().layers, schema_version=2).schema_version == 2


def _smoothed(lam=LAM) -> Profile:
    smoothed = LayerSpec(1, K4, QuantSpec(16), KeySmoothing.from_list(lam))
    layers = (LayerSpec(0, QuantSpec(8, 32), V2), smoothed)
    return Profile("tiny", FP, layers, created="2026-01-01T00:00:00+00:00").with_accounting()


def test_key_smoothing_needs_v3_and_round_trips(tmp_path):
    p = _smoothed()
    assert p.schema_version == 3
    d = p.to_dict()
    assert d["layers"][1]["k_smooth"] == LAM and "k_smooth" not in d["layers"][0]
    loaded = load_profile(save_profile(p, tmp_path / "v3.json"))
    assert loaded == p and loaded.layers[1].k_smooth.to_list() == LAM
    assert p.bytes_per_token == _profile().bytes_per_token  # λ costs no per-token bytes


def test_hash_covers_the_smoothing_factors():
    other = [row[:] for row in LAM]
    other[1][5] = 2.0
    assert _smoothed().hash != _smoothed(other).hash
    assert _smoothed().hash == _smoothed([row[:] for row in LAM]).hash
    unsmoothed = Profile("tiny", FP, [LayerSpec(s.layer, s.k, s.v) for s in _smoothed().layers])
    assert unsmoothed.schema_version == 1 and unsmoothed.hash != _smoothed().hash


def _prerope(k_bits: int = 4) -> Profile:
    k = QuantSpec(k_bits, 32, axis="channel", pre_rope=True)
    layers = (LayerSpec(0, QuantSpec(8, 32), V2), LayerSpec(1, k, QuantSpec(16)))
    return Profile("tiny", FP, layers, created="2026-01-01T00:00:00+00:00").with_accounting()


def test_prerope_keys_need_v4_round_trip_and_change_the_hash(tmp_path):
    p = _prerope()
    assert p.schema_version == 4
    d = p.to_dict()
    assert d["layers"][1]["k"]["pre_rope"] is True and "pre_rope" not in d["layers"][0]["k"]
    assert load_profile(save_profile(p, tmp_path / "v4.json")) == p
    plain = Profile("tiny", FP, [LayerSpec(s.layer, s.k, s.v) for s in p.layers][:1]
                    + [LayerSpec(1, QuantSpec(4, 32, axis="channel"), QuantSpec(16))])  # fmt: skip
    assert plain.schema_version == 1 and plain.hash != p.hash
    assert plain.bytes_per_token == p.bytes_per_token  # the rotation costs no bytes


def test_fields_are_exactly_the_schema(tmp_path):
    d = _profile().to_dict()
    assert set(d) == {
        "schema_version",
        "producer",
        "model",
        "layers",
        "budget",
        "calibration",
        "metrics",
        "created",
        "hash",
    }
    assert set(d["model"]) == {"id", "revision", "fingerprint"}
    assert set(d["model"]["fingerprint"]) == {
        "architecture",
        "num_layers",
        "num_kv_heads",
        "head_dim",
        "dtype",
        "hash",
    }
    assert d["layers"][1] == {"layer": 1, "k": K4.to_dict(), "v": QuantSpec(16).to_dict()}


def test_hash_is_stable_and_covers_only_the_runtime_part():
    p = _profile()
    assert p.hash == "f5e3eca5087648e7"  # canonical JSON of schema version, fingerprint, layers
    other = Profile(
        "another-id",
        FP,
        p.layers,
        metrics={"kl": 3.0},
        created="yesterday",
        calibration={"seed": 7},
        budget={"asked": "3bit"},
    )
    assert other.hash == p.hash
    # the dtype and the unused fields of a 16-bit spec do not change what a runtime does
    fp_bf16 = ModelFingerprint(
        FP.architecture, FP.num_layers, FP.num_kv_heads, FP.head_dim, "bfloat16"
    )
    v16 = LayerSpec(1, p.layers[1].k, QuantSpec(16, group_size=64, symmetric=True))
    assert Profile("tiny", fp_bf16, (p.layers[0], v16)).hash == p.hash
    changed = Profile("tiny", FP, (p.layers[0], LayerSpec(1, K4, QuantSpec(8, 32))))
    assert changed.hash != p.hash


def test_accounting():
    p = _profile()
    # per layer and KV head (one group of 32): K8 asym 32+4, V2 sym 8+2; K4 asym 16+4, V16 64
    assert p.bytes_per_token == 2 * (36 + 10) + 2 * (20 + 64)
    assert p.fp16_bytes_per_token == 2 * 2 * 2 * 32 * 2
    assert p.nominal_bits == (8 + 2 + 4 + 16) / 4
    assert p.effective_bits == pytest.approx(16 * p.bytes_per_token / p.fp16_bytes_per_token)
    assert p.budget == {
        "asked": "4bit",
        "nominal_bits": 7.5,
        "effective_bits": 8.125,
        "bytes_per_token": 260.0,
        "ratio_to_fp16": 0.5078,
    }


def test_uniform_and_model_config():
    fp = ModelFingerprint.from_config(tiny_config())
    assert fp == ModelFingerprint("LlamaForCausalLM", 2, 2, 32, "float32")
    p = Profile.uniform("tiny", fp, K4, K4)
    assert [s.k for s in p.layers] == [K4, K4] and p.nominal_bits == 4.0
    p.check_model(ModelFingerprint.from_config(tiny_config("qwen2")))  # same shapes: fits


# -- rejections: one clear line each ------------------------------------------------------------


def _edit(edit):
    d = _profile().to_dict()
    del d["hash"]
    edit(d)
    return d


REJECTIONS = {
    "bad_json": ('{"schema_version": 1,', "is not valid JSON"),
    "not_an_object": ("[1, 2]", "must be a JSON object"),
    "unknown_version": (
        _edit(lambda d: d.update(schema_version=0)),
        "unsupported profile schema_version 0",
    ),
    "newer_version": (
        _edit(lambda d: d.update(schema_version=5)),
        r"profile schema_version 5 is newer than this kvtuner reads \(versions 1, 2, 3, 4\); "
        "upgrade kvtuner",
    ),
    "prerope_in_v3": (
        _edit(lambda d: d.update(schema_version=3) or d["layers"][1]["k"].update(pre_rope=True)),
        r"schema_version 3 profiles hold no pre-RoPE keys \(pre_rope\); these layers need "
        "schema_version 4",
    ),
    "prerope_values": (
        _edit(lambda d: d.update(schema_version=4) or d["layers"][1]["v"].update(pre_rope=True)),
        "layer 1: pre_rope applies to keys only",
    ),
    "smoothing_in_v2": (
        _edit(lambda d: d.update(schema_version=2) or d["layers"][1].update(k_smooth=LAM)),
        r"schema_version 2 profiles hold no key smoothing \(k_smooth\); these layers need "
        "schema_version 3",
    ),
    "smoothing_shape": (
        _edit(lambda d: d.update(schema_version=3) or d["layers"][1].update(k_smooth=LAM[:1])),
        r"layer 1 k_smooth: smoothing factors are \[1, 32\], the model's keys \[2, 32\]",
    ),
    "smoothing_not_positive": (
        _edit(lambda d: d["layers"][1].update(k_smooth=[[0.0] * 32] * 2)),
        r"layer 1: smoothing factor \[0\]\[0\] = 0.0: must be a finite positive",
    ),
    "smoothing_not_fp16": (
        _edit(lambda d: d["layers"][1].update(k_smooth=[[0.1] * 32] * 2)),
        "fp16-representable",
    ),
    "smoothing_on_16bit_keys": (
        _edit(lambda d: d["layers"][0].update(k={"bits": 16}, k_smooth=LAM)),
        "layer 0: key smoothing applies to quantized token-axis keys only",
    ),
    "unknown_layer_field": (
        _edit(lambda d: d["layers"][0].update(v_smooth=LAM)),
        r"unknown layer field\(s\): v_smooth",
    ),
    "missing_version": (
        _edit(lambda d: d.pop("schema_version")),
        "unsupported profile schema_version None",
    ),
    "bits_outside_set": (
        _edit(lambda d: d["layers"][0]["k"].update(bits=7)),
        "layer 0: bits must be one of",
    ),
    "v2_bits_in_v1": (
        _edit(lambda d: d["layers"][0]["k"].update(bits=3)),
        "schema_version 1 profiles hold bits 2/4/8/16 only",
    ),
    "group_not_dividing": (
        _edit(lambda d: d["layers"][1]["v"].update(bits=4, group_size=64)),
        "layer 1 v: group_size 64 does not divide head_dim 32",
    ),
    "missing_layer": (
        _edit(lambda d: d["layers"].pop(1)),
        r"layers 0\.\.1 in order, once each \(missing \[1\]\)",
    ),
    "duplicate_layer": (
        _edit(lambda d: d["layers"][1].update(layer=0)),
        r"once each \(missing \[1\]\)",
    ),
    "layer_without_v": (_edit(lambda d: d["layers"][0].pop("v")), "needs 'layer', 'k' and 'v'"),
    "unknown_field": (_edit(lambda d: d.update(notes="x")), "unknown profile field\\(s\\): notes"),
    "unknown_spec_field": (
        _edit(lambda d: d["layers"][0]["k"].update(nbits_key=4)),
        "unknown quant spec field\\(s\\): nbits_key",
    ),
    "no_fingerprint": (
        _edit(lambda d: d["model"].pop("fingerprint")),
        "needs 'model' with a 'fingerprint'",
    ),
    "bad_fingerprint": (
        _edit(lambda d: d["model"]["fingerprint"].update(head_dim=0)),
        "head_dim must be a positive int",
    ),
    "hash_mismatch": (
        _edit(lambda d: d.update(hash="0123456789abcdef")),
        "profile hash 0123456789abcdef does not match its content",
    ),
    "budget_not_object": (_edit(lambda d: d.update(budget=4)), "'budget' must be an object"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejects(tmp_path, case):
    data, message = REJECTIONS[case]
    with pytest.raises(KVTunerError, match=message) as info:
        load_profile(_written(tmp_path, data))
    assert "\n" not in str(info.value)


def test_rejects_missing_file(tmp_path):
    with pytest.raises(KVTunerError, match="profile not found"):
        load_profile(tmp_path / "nope.json")


def test_hand_edit_without_hash_is_accepted(tmp_path):
    d = _edit(lambda d: d["layers"][0]["k"].update(bits=2))
    assert load_profile(_written(tmp_path, d)).layers[0].k.bits == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(num_hidden_layers=3), "num_layers is 2 in the profile but 3 in the model"),
        (dict(head_dim=64), "head_dim is 32 in the profile but 64 in the model"),
        (dict(num_key_value_heads=4), "num_kv_heads is 2 in the profile but 4 in the model"),
    ],
)
def test_rejects_model_mismatch(tmp_path, overrides, message):
    path = save_profile(_profile(), tmp_path / "p.json")
    assert load_profile(path, tiny_config()).hash == _profile().hash  # the matching model loads
    with pytest.raises(KVTunerError, match=message):
        load_profile(path, tiny_config(**overrides))
    with pytest.raises(KVTunerError, match=message):  # a fingerprint works the same
        load_profile(path, ModelFingerprint.from_config(tiny_config(**overrides)))


# -- hybrid (sliding-window) layouts -------------------------------------------------------------


def test_hybrid_fingerprint_records_each_layer_and_round_trips(tmp_path):
    fp = ModelFingerprint.from_config(tiny_config("gemma3"))
    assert fp.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
    assert fp.sliding_window == 8 and fp.layout.startswith("SSF ")
    p = Profile.uniform("tiny-gemma3", fp, K4, K4)
    d = p.to_dict()["model"]["fingerprint"]
    assert d["layer_types"] == list(fp.layer_types) and d["sliding_window"] == 8
    assert load_profile(save_profile(p, tmp_path / "g.json"), tiny_config("gemma3")) == p
    # the layout is part of the identity: the same shapes, all full attention, hash differently
    full = ModelFingerprint.from_config(tiny_config("gemma3", layer_types=["full_attention"] * 3))
    assert full.layer_types is None and full.hash != fp.hash
    assert ModelFingerprint(*astuple_shapes(fp)).hash == full.hash


def astuple_shapes(fp):
    return fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim


def test_full_attention_fingerprint_is_unchanged_by_the_layout_fields():
    fp = ModelFingerprint.from_config(tiny_config())
    assert "layer_types" not in fp.to_dict() and "sliding_window" not in fp.to_dict()
    assert fp.hash == "d1779fe189bc2c54"  # sha256 of [architecture, layers, heads, head_dim]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(layer_types=["full_attention"] * 3), "layout is SSF .* but all full attention"),
        (
            dict(sliding_window=16),
            "window 8, F: full. in the profile but SSF .S: sliding window 16",
        ),
    ],
)
def test_rejects_another_layout_in_one_line(tmp_path, overrides, message):
    fp = ModelFingerprint.from_config(tiny_config("gemma3"))
    path = save_profile(Profile.uniform("g", fp, K4, K4), tmp_path / "g.json")
    with pytest.raises(KVTunerError, match=message) as info:
        load_profile(path, tiny_config("gemma3", **overrides))
    assert "\n" not in str(info.value)


def test_rejects_a_bad_layout():
    with pytest.raises(KVTunerError, match="layer_types must list 2"):
        ModelFingerprint("X", 2, 1, 32, layer_types=("sliding_attention",), sliding_window=8)
    with pytest.raises(KVTunerError, match="sliding_window int >= 2"):
        ModelFingerprint("X", 1, 1, 32, layer_types=("sliding_attention",))
