"""KVTuner YAML presets -> profiles, validated against the model (a real local config dir)."""

import json

import pytest
import yaml
from conftest import tiny_config

from kvtuner import KVTunerError, load_profile
from kvtuner.calibration import model_fingerprint
from kvtuner.cli.main import main
from kvtuner.tuner.import_kvtuner import import_kvtuner_yaml


@pytest.fixture
def model_dir(tmp_path):
    """A 2-layer LLaMA config saved like a checkpoint (the fingerprint needs no weights)."""
    path = tmp_path / "tiny"
    tiny_config("llama").save_pretrained(path)
    return path


def write_yaml(path, bits):
    path.write_text(
        yaml.safe_dump({i: {"nbits_key": k, "nbits_value": v} for i, (k, v) in enumerate(bits)})
    )
    return path


def test_converts_bits_and_takes_axes_from_the_caller(tmp_path, model_dir):
    preset = write_yaml(tmp_path / "p.yaml", [(8, 4), (4, 2)])
    fp = model_fingerprint(str(model_dir))
    profile = import_kvtuner_yaml(preset, fp, model_id="tiny")
    assert [(s.k.bits, s.v.bits) for s in profile.layers] == [(8, 4), (4, 2)]
    assert profile.layers[0].k.axis == "channel" and profile.layers[0].v.axis == "token"
    assert profile.budget["nominal_bits"] == 4.5
    assert profile.calibration["file"] == "p.yaml"


def test_cli_writes_a_loadable_profile(tmp_path, model_dir, capsys):
    preset = write_yaml(tmp_path / "p.yaml", [(2, 16), (4, 4)])
    out = tmp_path / "out.json"
    code = main(
        [
            "import-kvtuner",
            str(preset),
            "--model",
            str(model_dir),
            "--output",
            str(out),
            "--key-axis",
            "token",
            "--key-rotation",
            "hadamard",
            "--group-size",
            "16",
        ]
    )
    assert code == 0
    profile = load_profile(out, model_fingerprint(str(model_dir)))
    assert profile.layers[0].k.rotation == "hadamard" and profile.layers[0].k.group_size == 16
    assert profile.layers[0].v.bits == 16
    assert json.loads(out.read_text())["hash"] == profile.hash


@pytest.mark.parametrize(
    "bits,content,match",
    [
        ([(4, 4)] * 3, None, "has 3 layers but tiny has 2"),
        (None, "0: {nbits_key: 4}\n1: {nbits_key: 4, nbits_value: 4}\n", "needs nbits_key"),
        (None, "0: {nbits_key: 7, nbits_value: 4}\n1: {nbits_key: 4, nbits_value: 4}\n", "bits"),
        (None, "1: {nbits_key: 4, nbits_value: 4}\n2: {nbits_key: 4, nbits_value: 4}\n", "0..1"),
        (None, "[1, 2\n", "cannot read"),
        (None, "- 4\n", "must map"),
    ],
)
def test_rejections_are_one_line(tmp_path, model_dir, bits, content, match):
    preset = tmp_path / "bad.yaml"
    if bits:
        write_yaml(preset, bits)
    else:
        preset.write_text(content)
    with pytest.raises(KVTunerError, match=match) as exc:
        import_kvtuner_yaml(preset, model_fingerprint(str(model_dir)), model_id="tiny")
    assert "\n" not in str(exc.value)


def test_cli_layer_mismatch_exits_2_with_one_line(tmp_path, model_dir, capsys):
    preset = write_yaml(tmp_path / "p.yaml", [(4, 4)] * 5)
    code = main(
        [
            "import-kvtuner",
            str(preset),
            "--model",
            str(model_dir),
            "--output",
            str(tmp_path / "o.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "5 layers" in err
    assert not (tmp_path / "o.json").exists()
