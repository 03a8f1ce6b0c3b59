"""`kvtuner show` / `kvtuner validate`, run as the real CLI (`python -m kvtuner`) in a subprocess:
exit 0 on success; bad input -> exit 2 with exactly one stderr line and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import tiny_config

from kvtuner.profile import LayerSpec, ModelFingerprint, Profile, save_profile
from kvtuner.quant import QuantSpec

FP = ModelFingerprint("LlamaForCausalLM", num_layers=2, num_kv_heads=2, head_dim=32)


def kvtuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtuner", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(res: subprocess.CompletedProcess, fragment: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and fragment in lines[0]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    layers = (
        LayerSpec(0, QuantSpec(8, 32), QuantSpec(4, 32)),
        LayerSpec(1, QuantSpec(4, 32), QuantSpec(2, 32)),
    )
    profile = Profile("tiny", FP, layers, metrics={"kl": 0.0123}).with_accounting(asked="4bit")
    return save_profile(profile, tmp_path_factory.mktemp("cli") / "profile.json")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Local model dirs (config only, as `save_pretrained` writes it): one fits, one does not."""
    root = tmp_path_factory.mktemp("models")
    tiny_config().save_pretrained(root / "fits")
    tiny_config(num_hidden_layers=3).save_pretrained(root / "three_layers")
    return root


def test_show_prints_table_and_totals(profile_path):
    res = kvtuner("show", profile_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "LlamaForCausalLM, 2 layers, 2 KV heads, head_dim 32" in lines[0]
    assert lines[1].split() == ["layer", "K", "V", "bytes/token"]
    assert lines[2].split() == ["0", "8b/g32/asym/token", "4b/g32/asym/token", "112.0"]  # 2*(36+20)
    assert lines[3].split() == ["1", "4b/g32/asym/token", "2b/g32/asym/token", "64.0"]  # 2*(20+12)
    assert lines[4] == (
        "total: 176.0 bytes/token (fp16: 512), nominal 4.500 bits, effective 5.500 bits, "
        "0.344x fp16"
    )
    assert lines[5] == "metrics: kl=0.0123"


def test_validate_ok(profile_path):
    res = kvtuner("validate", profile_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"ok: {profile_path} is a valid schema v1 profile (hash ")


def test_validate_against_a_local_model_dir(profile_path, model_dirs):
    res = kvtuner("validate", profile_path, "--model", model_dirs / "fits")
    assert res.returncode == 0, res.stderr
    assert f"fits {model_dirs / 'fits'}" in res.stdout
    res = kvtuner("validate", profile_path, "--model", model_dirs / "three_layers")
    assert_one_line_error(res, "num_layers is 2 in the profile but 3 in the model")


def test_validate_unknown_model(profile_path, tmp_path):
    assert_one_line_error(
        kvtuner("validate", profile_path, "--model", tmp_path / "nothing"),
        "kvtuner validate: error:",
    )


@pytest.mark.parametrize(
    ("command", "content", "fragment"),
    [
        ("show", None, "profile not found"),
        ("validate", "{not json", "is not valid JSON"),
        ("show", '{"schema_version": 9}', "profile schema_version 9 is newer than this kvtuner"),
    ],
)
def test_bad_profile_exits_2(tmp_path, command, content, fragment):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    res = kvtuner(command, path)
    assert_one_line_error(res, fragment)
    assert res.stderr.startswith(f"kvtuner {command}: error: ")


def test_tampered_profile_exits_2(profile_path, tmp_path):
    data = json.loads(profile_path.read_text())
    data["layers"][0]["k"]["bits"] = 2  # edited, hash left stale
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(data))
    assert_one_line_error(kvtuner("validate", path), "does not match its content")


def test_usage_errors_exit_2():
    assert_one_line_error(kvtuner("show"), "the following arguments are required: profile")
    assert_one_line_error(kvtuner("frobnicate"), "invalid choice")
