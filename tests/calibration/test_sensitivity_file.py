"""Sensitivity JSON: round trip, kl() lookups, one-line rejection of malformed files."""

from __future__ import annotations

import json

import pytest

from kvtuner import KVTunerError, ModelFingerprint
from kvtuner.calibration import Sensitivity


def make(num_layers=2, bits=(2, 4, 8)) -> Sensitivity:
    cell = lambda b, scale: {"kl": scale / b**2, "attn_rel_err": scale / b}  # noqa: E731
    layers = [
        {
            "layer": i,
            "k": {str(b): cell(b, 1.0 + i) for b in bits},
            "v": {str(b): cell(b, 0.5) for b in bits},
        }
        for i in range(num_layers)
    ]
    return Sensitivity(
        model_id="tiny",
        fingerprint=ModelFingerprint("LlamaForCausalLM", num_layers, 2, 32),
        data={
            "dataset": "d",
            "split": "train",
            "num_samples": 1,
            "seq_len": 8,
            "seed": 0,
            "tokens": 8,
        },
        bits=bits,
        key_spec={"group_size": 32, "symmetric": False, "axis": "token", "rotation": "hadamard"},
        value_spec={"group_size": 32, "symmetric": False, "axis": "token", "rotation": "none"},
        fp_ppl=12.5,
        layers=layers,
    )


def test_round_trip_and_lookups(tmp_path):
    sens = make()
    path = sens.save(tmp_path / "s.json")
    loaded = Sensitivity.load(path)
    assert loaded == sens
    assert loaded.kl(1, "k", 2) == 2.0 / 4 and loaded.kl(0, "v", 8) == 0.5 / 64
    assert loaded.kl(1, "k", 16) == 0.0 and loaded.attn_rel_err(0, "k", 4) == 0.25
    doc = json.loads(path.read_text())
    assert list(doc) == [
        "format",
        "version",
        "model",
        "data",
        "settings",
        "fp",
        "layers",
        "created",
    ]
    assert doc["model"]["fingerprint"]["hash"] == sens.fingerprint.hash


@pytest.mark.parametrize(
    "args, message",
    [
        ((5, "k", 2), "layer 5 out of range"),
        ((0, "q", 2), "part must be 'k' or 'v'"),
        ((0, "k", 3), "bits 3 not measured"),
    ],
)
def test_bad_lookups(args, message):
    with pytest.raises(KVTunerError, match=message):
        make().kl(*args)


def _broken(mutate):
    doc = make().to_dict()
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "not a kvtuner-sensitivity file"),
        (lambda d: d.update(version=2), "unsupported sensitivity version 2"),
        (lambda d: d["layers"].pop(), "has 1 layers, model fingerprint says 2"),
        (lambda d: d["layers"].reverse(), "listed in order"),
        (lambda d: d["layers"][0]["k"]["2"].update(kl=-1.0), "kl = -1.0"),
        (lambda d: d["layers"][0]["v"].pop("4"), "v4: needs"),
        (lambda d: d["settings"]["key_spec"].update(axis="diagonal"), "axis must be one of"),
        (lambda d: d.pop("fp"), "missing a field"),
    ],
)
def test_malformed_files_fail_in_one_line(tmp_path, mutate, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(mutate)))
    with pytest.raises(KVTunerError, match=message) as info:
        Sensitivity.load(path)
    assert "\n" not in str(info.value)


def test_not_json(tmp_path):
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(KVTunerError, match="not valid JSON"):
        Sensitivity.load(tmp_path / "x.json")
