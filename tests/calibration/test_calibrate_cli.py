"""`python -m kvtuner calibrate` end to end on a tiny saved model; bad input -> one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from calib_helpers import save_tiny

from kvtuner.calibration import Sensitivity

TEXT = "A small calibration corpus for a tiny model. " * 60


def kvtuner(*args, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvtuner", "calibrate", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", "qwen2")


def test_calibrate_writes_sensitivity_plot_and_reuses_cache(tiny_dir, tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    args = [
        "--model",
        str(tiny_dir),
        "--dataset",
        str(tmp_path / "corpus.txt"),
        "--num-samples",
        "2",
        "--seq-len",
        "64",
        "--seed",
        "3",
        "--preset",
        "kivi",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    run = kvtuner(*args, "--output", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png"))
    assert run.returncode == 0, run.stderr
    sens = Sensitivity.load(tmp_path / "s.json")
    assert sens.fingerprint.architecture == "Qwen2ForCausalLM" and len(sens.layers) == 2
    assert sens.key_spec["axis"] == "channel" and sens.data["seed"] == 3
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert "most key-sensitive layers at 2 bits" in run.stdout
    again = kvtuner(*args, "--output", str(tmp_path / "t.json"))
    assert again.returncode == 0, again.stderr
    first, second = (json.loads((tmp_path / n).read_text()) for n in ("s.json", "t.json"))
    assert first["layers"] == second["layers"]


def test_flags_override_the_preset(tiny_dir, tmp_path):
    run = kvtuner(
        "--model",
        str(tiny_dir),
        "--num-samples",
        "1",
        "--seq-len",
        "32",
        "--key-rotation",
        "none",
        "--value-rotation",
        "hadamard",
        "--group-size",
        "16",
        "--symmetric",
        "--bits",
        "2",
        "--no-cache",
        "--no-progress",
        "--output",
        str(tmp_path / "s.json"),
    )
    assert run.returncode == 0, run.stderr
    sens = Sensitivity.load(tmp_path / "s.json")
    assert sens.bits == (2,) and sens.data["dataset"] == "embedded:wikitext-2-valid"
    assert sens.key_spec == {
        "group_size": 16,
        "symmetric": True,
        "axis": "token",
        "rotation": "none",
    }
    assert sens.value_spec["rotation"] == "hadamard" and sens.value_spec["group_size"] == 16


def test_a_per_head_preset_calibrates_one_group_a_row(tiny_dir, tmp_path):
    """``per-token-head``: the group becomes the model's head_dim once the model is loaded."""
    args = ["--model", str(tiny_dir), "--num-samples", "1", "--seq-len", "32", "--bits", "4"]
    run = kvtuner(*args, "--preset", "per-token-head-had", "--no-cache", "--no-progress",
                  "--output", str(tmp_path / "s.json"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    sens = Sensitivity.load(tmp_path / "s.json")
    head_dim = json.loads((tiny_dir / "config.json").read_text())["head_dim"]
    assert sens.key_spec["group_size"] == sens.value_spec["group_size"] == head_dim
    assert sens.key_spec["rotation"] == sens.value_spec["rotation"] == "hadamard"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "./no/such/model"], "model not found"),
        (["--model", "someorg/missing-model"], "not in the local cache, and HF_HUB_OFFLINE is set"),
        (["--dataset", "/no/such/corpus.txt"], "dataset not found"),
        (["--dataset", "hf:wikitext"], "expected hf:NAME:CONFIG:SPLIT"),
        (["--group-size", "48"], "group_size must be a power of two"),
        (["--bits", "7"], "--bits must be among 2,3,4,5,6,8"),
        (["--preset", "nope"], "unknown preset"),
        (["--num-samples", "x"], "invalid int value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    run = kvtuner(*args, "--output", str(tmp_path / "s.json"))
    assert run.returncode == 2
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "s.json").exists()


def test_bad_dataset_content_after_model_load(tiny_dir, tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")
    run = kvtuner(
        "--model",
        str(tiny_dir),
        "--dataset",
        str(tmp_path / "tiny.txt"),
        "--no-progress",
        "--output",
        str(tmp_path / "s.json"),
    )
    assert run.returncode == 2 and "too few for 1 sample(s) of 256 tokens" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
