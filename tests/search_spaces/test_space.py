"""Presets, clustering and the pruned per-layer search space."""

import json

import numpy as np
import pytest

from kvtuner import KVTunerError, ModelFingerprint, QuantSpec
from kvtuner.search_spaces import (
    BITS,
    PRESETS,
    LossTable,
    build_space,
    cluster_layers,
    load_preset,
    pareto_front,
)
from kvtuner.tuner import Budget

FP = ModelFingerprint("LlamaForCausalLM", num_layers=6, num_kv_heads=3, head_dim=64)


def synthetic_losses(num_layers=6, seed=0):
    """KL falling ~10x per bit doubling, keys 3x worse than values, layers 0 and 3 fragile."""
    rng = np.random.default_rng(seed)
    kl = np.zeros((num_layers, 2, len(BITS)))
    for i in range(num_layers):
        base = (20.0 if i in (0, 3) else 1.0) * rng.uniform(0.8, 1.25)
        for p, part_scale in enumerate((3.0, 1.0)):
            kl[i, p, :3] = base * part_scale * np.array([1.0, 0.1, 0.005])
    return LossTable(kl)


def test_presets():
    pt, kivi = PRESETS["per-token"], PRESETS["kivi"]
    assert pt.servable_by_sglang and not kivi.servable_by_sglang
    s = pt.layer_spec(0, 4, 2)
    assert s.k == QuantSpec(4, 32, rotation="hadamard") and s.v == QuantSpec(2, 32)
    assert kivi.layer_spec(1, 2, 16).k.axis == "channel" and kivi.layer_spec(1, 2, 16).v.bits == 16
    assert kivi.layer_spec(0, 4, 3).v == QuantSpec(3, 32)
    hadv = PRESETS["kivi-hadv"].layer_spec(0, 4, 3)
    assert hadv.k == QuantSpec(4, 32, axis="channel")
    assert hadv.v == QuantSpec(3, 32, rotation="hadamard")
    assert pt.layer_spec(0, 16, 16).k == QuantSpec(16)
    pre = PRESETS["kivi-prerope-hadv"]
    assert pre.layer_spec(0, 3, 4).k == QuantSpec(3, 32, axis="channel", pre_rope=True)
    assert pre.layer_spec(0, 16, 4).k == QuantSpec(16)  # 16 bits: stored as the model gives it
    assert not PRESETS["kivi-prerope"].servable_by_sglang


def test_g64_preset_halves_the_metadata_of_per_token():
    g64, g32 = PRESETS["per-token-g64"], PRESETS["per-token"]
    assert g64.servable_by_sglang and g64.key.rotation == "hadamard"
    effective = lambda p: p.layer_spec(0, 4, 4).k.exact_bytes_per_token(64) * 8 / 64  # noqa: E731
    assert (effective(g32), effective(g64)) == (5, 4.5)


def test_per_token_head_presets_take_the_models_head_dim_as_their_group():
    for name, rotation in (("per-token-head", "none"), ("per-token-head-had", "hadamard")):
        preset = PRESETS[name]
        assert preset.servable_by_sglang and preset.group_per_head
        for head_dim in (64, 128, 256):
            spec = preset.for_head_dim(head_dim).layer_spec(0, 5, 4)
            assert spec.k == QuantSpec(5, head_dim, rotation=rotation)
            assert spec.v == QuantSpec(4, head_dim, rotation=rotation)
    # one fp16 scale and zero a row: at head_dim 128, 4.25 bits an element at 4 bits (g32: 5)
    k = PRESETS["per-token-head"].for_head_dim(128).layer_spec(0, 4, 4).k
    assert k.exact_bytes_per_token(128) * 8 / 128 == 4.25
    assert PRESETS["per-token"].for_head_dim(128) is PRESETS["per-token"]


def test_kivi_prerope_g64_is_kivi_prerope_in_groups_of_64():
    g64, g32 = PRESETS["kivi-prerope-g64"], PRESETS["kivi-prerope"]
    spec = g64.layer_spec(0, 4, 3)
    assert spec.k == QuantSpec(4, 64, axis="channel", pre_rope=True) and spec.v == QuantSpec(3, 64)
    assert not g64.servable_by_sglang  # channel keys: pages of 64 tokens
    # K4V3 in groups of 64 costs what K3V3 in groups of 32 does (4.5 + 3.5 = 4 + 4 bits)
    size = lambda s: s.k.exact_bytes_per_token(64) + s.v.exact_bytes_per_token(64)  # noqa: E731
    assert size(spec) == size(g32.layer_spec(0, 3, 3))


def test_user_preset_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(
            {
                "name": "g64sym",
                "key": {"group_size": 64, "symmetric": True},
                "value": {"group_size": 64},
            }
        )
    )
    preset = load_preset(path)
    assert preset.name == "g64sym" and preset.servable_by_sglang
    assert preset.layer_spec(0, 8, 4).k == QuantSpec(8, 64, symmetric=True)
    path.write_text(json.dumps({"key": {"pre_rope": True}, "value": {}}))
    assert not load_preset(path).servable_by_sglang  # the pool's pre-RoPE keys are KIVI only
    path.write_text(json.dumps({"key": {"axis": "sideways"}, "value": {}}))
    with pytest.raises(KVTunerError, match="axis"):
        load_preset(path)
    with pytest.raises(KVTunerError, match="unknown preset"):
        load_preset("nonesuch")


@pytest.mark.parametrize("budget", ["2bit", "2.5bit", "3bit", "4bit", "6bit", "0.3x", "0.5x"])
def test_space_options_are_pareto_plus_fitting_uniforms(budget):
    losses, b = synthetic_losses(), Budget.parse(budget)
    space = build_space(losses, PRESETS["per-token"], FP, b)
    assert space.uniform_pairs and all(space.fits(space.uniform(p)) for p in space.uniform_pairs)
    for i, group in enumerate(space.groups):
        pairs = [(k, v) for k in BITS for v in BITS]
        front = set(pareto_front([(space.cost(i, p), space.loss(i, p), p) for p in pairs]))
        assert set(group.options) == front | set(space.uniform_pairs)
        costs = [space.cost(i, p) for p in group.options]
        assert costs == sorted(costs)


def test_budget_below_cheapest_is_one_line_error():
    with pytest.raises(KVTunerError, match="below the cheapest"):
        build_space(synthetic_losses(), PRESETS["per-token"], FP, Budget.parse("1.5bit"))


def test_clustering_groups_similar_layers():
    losses = synthetic_losses()
    groups = cluster_layers(losses, 2)
    assert groups == [[0, 3], [1, 2, 4, 5]]
    assert cluster_layers(losses, 10) == [[i] for i in range(6)]
    space = build_space(losses, PRESETS["kivi"], FP, Budget.parse("4bit"), num_clusters=2)
    assert [g.layers for g in space.groups] == [(0, 3), (1, 2, 4, 5)]
    specs = space.layer_specs([(8, 4), (2, 2)])
    assert [s.k.bits for s in specs] == [8, 2, 2, 8, 2, 2]
    with pytest.raises(KVTunerError):
        cluster_layers(losses, 0)


def test_params_round_trip_and_layer_count_check():
    space = build_space(synthetic_losses(), PRESETS["per-token"], FP, Budget.parse("4bit"))
    choice = tuple(g.options[-1] for g in space.groups)
    assert space.from_params(space.to_params(choice)) == choice
    with pytest.raises(KVTunerError, match="6"):
        build_space(synthetic_losses(5), PRESETS["per-token"], FP, Budget.parse("4bit"))
