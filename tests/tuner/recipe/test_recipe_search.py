"""`kvtuner.search(target="recipe")` and `kvtuner search --target recipe` on a tiny real
checkpoint (random LLaMA, 4 layers, head_dim 32, byte tokenizer): the recipe fits the budget, is
measured no worse than ModelOpt's additive pick, resumes from its study, and every export reads
back; bad recipes are one line and exit 2."""

import json
import sys
from pathlib import Path

import pytest

from kvtuner import KVTunerError, search
from kvtuner.cli.main import main
from kvtuner.profile.recipe_profile import load_recipe_profile
from kvtuner.runtime_loader.engines import parse_trtllm_kv_dtype, read_quant_config
from kvtuner.tuner.budget import Budget
from kvtuner.tuner.recipe import RecipeGoal

sys.path.insert(0, str(Path(__file__).parents[2] / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

TEXT = dict(num_samples=2, seq_len=32, confirm_samples=3)


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    return save_tiny(tmp_path / "tiny", num_hidden_layers=4)


def _search(tiny_dir, out, engine="vllm", budget="7bit", formats=None, n_trials=4):
    storage = f"sqlite:///{out.parent / 'recipes.db'}"  # one study for every search here
    return search(target="recipe", model=str(tiny_dir), engine=engine, budget=budget,
                  formats=formats, output=out, n_trials=n_trials, storage=storage,
                  log=lambda _: None, progress=False, **TEXT)  # fmt: skip


def test_recipe_fits_beats_or_ties_modelopt_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "recipe.json"
    first = _search(tiny_dir, out)
    profile = load_recipe_profile(out)
    assert profile.effective_bits <= 7 and profile.engine == "vllm"
    assert set(profile.recipe.layers) <= {"auto", "fp8", "nvfp4"}
    m = profile.metrics
    assert m["confirm_kl"] <= m["confirm_modelopt_kl"]  # ModelOpt's pick is a finalist
    if m["chosen"] == "search":  # a held-back gain past the margin, else ModelOpt's pick stays
        assert m["confirm_gain"] > 2 * m["confirm_gain_se"]
    else:
        assert list(profile.recipe.layers) == m["modelopt_layers"]
    assert set(m["modelopt_layers"]) <= {"fp8", "nvfp4"}  # it never picks the model dtype
    assert first.trials > 2 * 4 * 2  # both one-layer tables and whole recipes
    again = _search(tiny_dir, out)
    assert again.trials == first.trials  # every recipe came back from the study
    assert again.profile.recipe == first.profile.recipe
    cheaper = _search(tiny_dir, tmp_path / "cheaper.json", budget="5bit")
    assert cheaper.profile.effective_bits <= 5
    tables = 4 * 2 + 4 * 2  # isolated fp8/nvfp4, in context fp8/auto (4 layers)
    assert cheaper.trials - first.trials < tables  # the one-layer tables came back
    # ModelOpt's two formats: recipes with model-dtype layers (its isolated table) never win
    narrow = _search(tiny_dir, tmp_path / "narrow.json", budget="16bit", formats=("fp8", "nvfp4"))
    assert set(narrow.profile.recipe.layers) <= {"fp8", "nvfp4"}


def test_the_cli_writes_a_recipe_and_every_engine_form(tiny_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["search", "--model", str(tiny_dir), "--target", "recipe", "--engine", "trtllm",
            "--budget", "6bit", "--n-trials", "2", "--num-samples", "2", "--seq-len", "32",
            "--confirm-samples", "1", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    layers = load_recipe_profile(out).recipe.layers
    capsys.readouterr()
    assert main(["recipe-args", str(out), "--engine", "trtllm"]) == 0
    assert parse_trtllm_kv_dtype(capsys.readouterr().out.strip(), 4) == layers
    assert main(["recipe-args", str(out), "--engine", "modelopt"]) == 0
    assert read_quant_config(json.loads(capsys.readouterr().out), 4) == layers
    assert main(["recipe-args", str(out), "--engine", "vllm"]) == 0
    assert capsys.readouterr().out.startswith("--kv-cache-dtype")
    hf = tmp_path / "hf"
    export = ["export-hf", "--model", str(tiny_dir), "--output", str(hf), "--recipe", str(out)]
    assert main(export) == 0
    quant = json.loads((hf / "hf_quant_config.json").read_text())["quantization"]
    assert read_quant_config(quant, 4) == layers
    assert (hf / "kv_scales.safetensors").is_file()
    assert main(export) == 2  # a checkpoint with a recipe is a new folder
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["recipe"]["layers"].__setitem__(0, "int3"), "unknown layer format"),
        (lambda d: d["recipe"]["layers"].append("fp8"), "needs 5 k_amax"),
        (lambda d: d.update(schema_version=7), "schema_version 7"),
        (lambda d: d.update(engine="trtllm") or d["recipe"]["layers"].__setitem__(0, "fp8k_nvfp4v"),
         "trtllm does not serve fp8k_nvfp4v"),
        (lambda d: d.update(extra=1), "unknown recipe profile field"),
    ],
)  # fmt: skip
def test_a_bad_recipe_profile_is_one_line_and_exit_2(tmp_path, capsys, edit, match):
    good = {"target": "recipe", "schema_version": 1, "engine": "modelopt",
            "model": {"id": "tiny", "fingerprint": {"architecture": "LlamaForCausalLM",
                      "num_layers": 4, "num_kv_heads": 2, "head_dim": 32}},
            "recipe": {"layers": ["fp8", "nvfp4", "nvfp4", "auto"], "k_amax": [1.0] * 4,
                       "v_amax": [1.0] * 4}}  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good))
    assert main(["recipe-args", str(path), "--engine", "modelopt"]) == 0
    edit(good)
    path.write_text(json.dumps(good))
    capsys.readouterr()
    assert main(["recipe-args", str(path), "--engine", "modelopt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_a_bad_recipe_target_fails_before_any_model_loads():
    with pytest.raises(KVTunerError, match="unknown engine 'sglang'"):
        RecipeGoal("sglang", Budget.parse("5bit"))
    with pytest.raises(KVTunerError, match="effective bits"):
        RecipeGoal("vllm", Budget.parse("0.3x"))
    with pytest.raises(KVTunerError, match="unknown format"):
        RecipeGoal("vllm", Budget.parse("5bit"), ("fp8", "int2"))
    with pytest.raises(KVTunerError, match="at least two formats"):
        RecipeGoal("vllm", Budget.parse("5bit"), ("fp8",))
