"""The "most sensitive layers at 8 bits" peer rows: ranking and the specs they build."""

from __future__ import annotations

import pytest

from kvtuner import KVTunerError, ModelFingerprint
from kvtuner.calibration import Sensitivity
from kvtuner.evaluation import parse_uniform
from kvtuner.evaluation.sensitive_layers import (
    most_sensitive_layers,
    with_sensitive_layers_raised,
)

FP = ModelFingerprint("Qwen2ForCausalLM", 4, 2, 64)
DAMAGE = {0: 3.0, 1: 0.5, 2: 9.0, 3: 1.0}  # K+V KL at 4 bits; layer 2 dominates, then 0


def sensitivity() -> Sensitivity:
    cell = lambda kl: {"kl": kl, "attn_rel_err": 0.1}  # noqa: E731
    layers = [
        {
            "layer": i,
            "k": {"4": cell(0.75 * DAMAGE[i]), "8": cell(0.01)},
            "v": {"4": cell(0.25 * DAMAGE[i]), "8": cell(0.01)},
        }
        for i in range(4)
    ]
    data = {"dataset": "d", "split": "s", "num_samples": 1, "seq_len": 8, "seed": 0, "tokens": 8}
    return Sensitivity(
        model_id="tiny",
        fingerprint=FP,
        data=data,
        bits=(4, 8),
        key_spec={"group_size": 32, "symmetric": False, "axis": "channel", "rotation": "none"},
        value_spec={"group_size": 32, "symmetric": False, "axis": "token", "rotation": "none"},
        fp_ppl=10.0,
        layers=layers,
    )


def test_ranking_is_by_k_plus_v_damage_at_the_base_bits():
    assert most_sensitive_layers(sensitivity(), 4, 2) == (2, 0)


def test_raised_row_keeps_axis_and_rotation_and_costs_more_bytes():
    base = parse_uniform("kivi-hadv-kv4", FP)[0]
    raised = with_sensitive_layers_raised(base, sensitivity(), 1)
    assert raised.name == "kivi-hadv-kv4+8bit-l2"
    for old, new in zip(base.specs, raised.specs, strict=True):
        want = 8 if old.layer == 2 else 4
        assert (new.k.bits, new.v.bits) == (want, want)
        assert (new.k.axis, new.v.rotation) == (old.k.axis, old.v.rotation)
    assert raised.accounting(FP)["bytes_per_token"] > base.accounting(FP)["bytes_per_token"]


def test_missing_bit_width_is_one_line():
    with pytest.raises(KVTunerError, match="no 3-bit column"):
        with_sensitive_layers_raised(parse_uniform("kv3", FP)[0], sensitivity(), 1)
