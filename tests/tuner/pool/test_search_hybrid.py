"""A hybrid (sliding-window + global) model through every stage: calibrate, search at a stated
context length, the profile's layout, `kvtuner eval` — tiny random Gemma 3, nothing mocked."""

import json
import sys
from pathlib import Path

import pytest

from kvtuner import Profile, QuantSpec, search
from kvtuner.calibration import model_fingerprint
from kvtuner.cli.main import main
from kvtuner.profile import load_profile, save_profile
from kvtuner.tuner.study import StudySettings

sys.path.insert(0, str(Path(__file__).parents[2] / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

WINDOW, CONTEXT = 16, 256


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gemma3")
    return save_tiny(path, "gemma3", num_hidden_layers=6, sliding_window=WINDOW)


def test_search_calibrates_and_budgets_window_layers_at_the_context(gemma_dir, tmp_path):
    out = tmp_path / "profile.json"
    outcome = search(
        model=str(gemma_dir),
        budget="3bit",
        output=out,
        num_samples=2,
        seq_len=64,
        context_length=CONTEXT,
        study=StudySettings(n_trials=8, seed=1),
        confirm_samples=0,
        progress=False,
        log=lambda _: None,
    )
    fp = model_fingerprint(str(gemma_dir))
    profile = load_profile(out, fp)
    assert profile.fingerprint.layout == fp.layout == "SSFSSF (S: sliding window 16, F: full)"
    assert profile.budget["context_length"] == CONTEXT and profile.context_length == CONTEXT
    # window layers hold 15 of 256 tokens: the bits mean weighs them by 15/256
    weights = [15 / 256 if t == "sliding_attention" else 1 for t in fp.layer_types]
    bits = [s.k.bits + s.v.bits for s in profile.layers]
    weighted = sum(w * b for w, b in zip(weights, bits, strict=True)) / (2 * sum(weights))
    assert profile.nominal_bits == pytest.approx(weighted) and weighted <= 3
    assert profile.kv_bytes(CONTEXT) == pytest.approx(profile.bytes_per_token * CONTEXT)
    sens = json.loads((tmp_path / "profile.sensitivity.json").read_text())
    assert sens["model"]["fingerprint"]["layer_types"] == list(fp.layer_types)
    assert outcome.best.kl >= 0


def test_eval_runs_a_hybrid_model_and_its_profile(gemma_dir, tmp_path, capsys):
    report, text = tmp_path / "eval.json", tmp_path / "text.txt"
    text.write_text(Path(__file__).read_text())  # any text: the model is random
    fp = model_fingerprint(str(gemma_dir))
    profile = save_profile(
        Profile.uniform("g", fp, QuantSpec(4), QuantSpec(8)), tmp_path / "p.json"
    )
    argv = ["eval", "--model", str(gemma_dir), "--uniform", "kv4,kv16", "--no-decode"]
    argv += ["--profile", str(profile), "--num-windows", "1", "--seq-len", "48"]
    argv += ["--output", str(report), "--dataset", str(text)]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(report.read_text())["rows"]}
    assert rows["kv16"]["ppl"] == rows["fp"]["ppl"]  # a 16-bit cache is the default cache
    capped = fp.fp16_bytes(48) / 48  # window layers hold 15 of the 48 tokens
    assert rows["fp"]["bytes_per_token"] == pytest.approx(capped, abs=0.01)
    assert rows["kv16"]["bytes_per_token"] == pytest.approx(capped, abs=0.01)
    assert rows["kv4"]["ratio_to_fp16"] < rows["p"]["ratio_to_fp16"] < 0.6


def test_eval_refuses_transformers_quantized_cache_on_a_hybrid_model(gemma_dir, capsys):
    assert main(["eval", "--model", str(gemma_dir), "--uniform", "kv4", "--hf-quanto", "on"]) == 2
    err = capsys.readouterr().err.strip()
    assert "QuantizedCache refuses sliding-window layers" in err and "\n" not in err
