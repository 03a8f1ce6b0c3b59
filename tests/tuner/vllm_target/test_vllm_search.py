"""`kvtuner.search(target="vllm")` on a tiny real checkpoint (random LLaMA + byte tokenizer): the
skip set fits the budget, beats or ties D on every layer, the study resumes, --ppl-within
answers."""

import sys
from pathlib import Path

import pytest

from kvtuner import KVTunerError, search
from kvtuner.cli.main import main
from kvtuner.profile import load_vllm_profile
from kvtuner.tuner.budget import Budget

sys.path.insert(0, str(Path(__file__).parents[2] / "calibration"))
from calib_helpers import save_tiny  # noqa: E402


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    return save_tiny(tmp_path / "tiny", num_hidden_layers=4)


def _search(tiny_dir, out, **target):
    kw = dict(num_samples=2, seq_len=32, confirm_samples=1, n_trials=5, log=lambda _: None)
    return search(target="vllm", model=str(tiny_dir), output=out, progress=False, **target, **kw)


def test_search_fits_the_budget_beats_uniform_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "p.json"
    # 4 layers: fp8 everywhere is 0.5x of bf16, each skip adds 0.125x -> 0.75x allows 2
    first = _search(tiny_dir, out, kv_cache_dtype="fp8_e4m3", budget=Budget.parse("0.75x"))
    profile = load_vllm_profile(out)
    assert len(profile.plan.skip_layers) <= 2 and profile.budget["skip_cap"] == 2
    assert profile.budget["ratio_to_model_dtype"] <= 0.75
    assert first.kl <= first.uniform_kl
    rules = {"additive", "greedy", "boundary", "largest-keys"}
    assert set(profile.metrics["rule"].split("+")) <= rules
    again = _search(tiny_dir, out, kv_cache_dtype="fp8_e4m3", budget=Budget.parse("0.75x"))
    assert again.trials == first.trials  # every candidate was in the study already
    capped = _search(tiny_dir, tmp_path / "q.json", kv_cache_dtype="fp8_e4m3", max_skip=1)
    assert len(capped.profile.plan.skip_layers) <= 1


def test_ppl_within_and_bad_input(tiny_dir, tmp_path, capsys):
    loose = _search(tiny_dir, tmp_path / "p.json", kv_cache_dtype="fp8_e5m2", ppl_within=50.0)
    assert loose.profile.plan.skip_layers == ()  # fp8 alone is well within 50 %
    with pytest.raises(KVTunerError, match="below"):
        _search(tiny_dir, tmp_path / "b.json", kv_cache_dtype="fp8", budget=Budget.parse("0.4x"))
    argv = ["search", "--model", str(tiny_dir), "--target", "vllm", "--max-skip", "1"]
    assert main(argv) == 2
    assert "--kv-cache-dtype" in capsys.readouterr().err


def test_int4_per_token_head_from_the_cli(tiny_dir, tmp_path, capsys):
    """int4_per_token_head is searched, saved and handed back as vLLM's flags; ultraquant_4bit
    (not emulated) is refused in one line that says why."""
    out = tmp_path / "int4.json"
    argv = ["search", "--model", str(tiny_dir), "--target", "vllm", "--kv-cache-dtype",
            "int4_per_token_head", "--max-skip", "1", "--num-samples", "2", "--seq-len", "32",
            "--confirm-samples", "1", "--n-trials", "3", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    plan = load_vllm_profile(out).plan
    assert plan.kv_cache_dtype == "int4_per_token_head" and len(plan.skip_layers) <= 1
    capsys.readouterr()
    assert main(["vllm-args", str(out)]) == 0
    assert "--kv-cache-dtype int4_per_token_head" in capsys.readouterr().out
    argv[argv.index("int4_per_token_head")] = "ultraquant_4bit"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "UE8M0" in err[0]
