"""The whole `search()` pipeline on a tiny real checkpoint (random LLaMA + byte tokenizer):
calibration, study, profile, Pareto set, plot, resume — every KL measured, nothing mocked."""

import json
import sys
from pathlib import Path

import pytest
import torch

from kvtuner import KVTunerError, search
from kvtuner.calibration import load_calibration_data, load_model, model_fingerprint
from kvtuner.profile import load_profile
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache
from kvtuner.tuner.study import StudySettings

sys.path.insert(0, str(Path(__file__).parents[2] / "calibration"))
from calib_helpers import save_tiny  # noqa: E402


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    return save_tiny(tmp_path / "tiny", num_hidden_layers=4)


def run(tiny_dir, out, logs, **kw):
    args = dict(
        model=str(tiny_dir),
        budget="3bit",
        output=out,
        num_samples=2,
        seq_len=64,
        study=StudySettings(n_trials=12, seed=1),
        confirm_samples=0,  # on by default; its own test below
        progress=False,
        log=logs.append,
    )
    return search(**{**args, **kw})


def test_search_writes_the_best_feasible_profile_and_resumes(tiny_dir, tmp_path):
    out, logs = tmp_path / "run" / "profile.json", []
    outcome = run(
        tiny_dir, out, logs, pareto_dir=tmp_path / "pareto", plot=tmp_path / "p.png", baselines=True
    )
    profile = load_profile(out, model_fingerprint(str(tiny_dir)))
    assert profile.nominal_bits <= 3.0 and profile.budget["asked"] == "3bit"
    assert profile.metrics["kl"] == pytest.approx(outcome.best.kl, rel=1e-5)
    fitting = [b for b in outcome.baselines if b.fits]
    assert {b.label for b in fitting} == {"k2v2", "k2v3", "k3v2", "k3v3", "k2v4", "k4v2"}
    assert len(outcome.baselines) == 25  # 2,3,4,5,8 squared: the over-budget ones measured too
    assert outcome.best.kl <= min(b.kl for b in fitting)
    assert profile.calibration["tokens"] == 128 and profile.budget["preset"] == "per-token"
    pareto = json.loads((tmp_path / "pareto" / "pareto.json").read_text())["pareto"]
    assert profile.hash in {p["hash"] for p in pareto}
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "uniform k4v2" in outcome.summary and (out.parent / "profile.optuna.db").exists()
    # rerun: cached sensitivity, resumed study (no new trial), same profile
    logs.clear()
    again = run(tiny_dir, out, logs)
    assert any(line.startswith("sensitivity: ") for line in logs)
    assert again.trials == outcome.trials and again.profile.hash == profile.hash


def test_confirmation_keeps_the_finalist_best_on_held_back_windows(tiny_dir, tmp_path):
    logs = []
    outcome = run(tiny_dir, tmp_path / "c.json", logs, confirm_samples=2)
    confirmed = outcome.confirmation
    assert confirmed and [c.score for c in confirmed] == sorted(c.score for c in confirmed)
    assert any(len(set(c.measured.choice)) == 1 for c in confirmed)  # the best uniform is in
    assert outcome.best == confirmed[0].measured
    metrics = outcome.profile.metrics
    assert metrics["confirm_tokens"] == 128 and metrics["confirm_finalists"] == len(confirmed)
    assert metrics["confirm_kl"] == pytest.approx(confirmed[0].score, rel=1e-5)
    assert metrics["kl"] == pytest.approx(confirmed[0].measured.kl, rel=1e-5)
    assert any(line.startswith("confirmation on 128 more") for line in logs)


def test_confirmation_by_nll_ranks_by_the_texts_nll_on_longer_windows(tiny_dir, tmp_path):
    logs = []
    kw = dict(confirm_samples=2, confirm_seq_len=96, confirm_metric="nll")
    outcome = run(tiny_dir, tmp_path / "n.json", logs, **kw)
    confirmed = outcome.confirmation
    assert {c.metric for c in confirmed} == {"nll"} and outcome.best == confirmed[0].measured
    assert [c.score for c in confirmed] == sorted(c.score for c in confirmed)
    assert any(len(set(c.measured.choice)) == 1 for c in confirmed)
    metrics = outcome.profile.metrics
    assert metrics["confirm_tokens"] == 192 and "confirm_kl" not in metrics
    assert metrics["confirm_nll"] == pytest.approx(confirmed[0].score, rel=1e-5)
    assert any("NLL of the text" in line for line in logs)
    # the score is the text's NLL under that config, on windows the study never saw
    lm, tok = load_model(str(tiny_dir))
    study = load_calibration_data(tok, num_samples=2, seq_len=64, seed=0)
    held = load_calibration_data(tok, num_samples=2, seq_len=96, seed=0, disjoint_from=study)
    nll = []
    for ids in held.tokens:
        cache = make_cache(lm, confirmed[-1].measured.specs)
        with torch.inference_mode():
            logits = lm(ids[None], **cache_kwargs(cache), use_cache=True).logits[0, :-1]
        nll.append(float(torch.nn.functional.cross_entropy(logits.float(), ids[1:])))
    assert confirmed[-1].score == pytest.approx(sum(nll) / 2, rel=1e-4)


def test_confirm_metric_is_checked(tiny_dir, tmp_path):
    with pytest.raises(KVTunerError, match="--confirm-metric"):
        run(tiny_dir, tmp_path / "m.json", [], confirm_metric="ppl")
    with pytest.raises(KVTunerError, match="--confirm-seq-len"):
        run(tiny_dir, tmp_path / "m.json", [], confirm_seq_len=0)


def test_confirmation_needs_enough_text(tiny_dir, tmp_path):
    with pytest.raises(KVTunerError, match="--confirm-samples"):
        run(tiny_dir, tmp_path / "d.json", [], confirm_samples=10**6)


def test_ratio_budget_and_clusters(tiny_dir, tmp_path):
    outcome = run(tiny_dir, tmp_path / "r.json", [], budget="0.3x", num_clusters=2, preset="kivi")
    p = outcome.profile
    assert p.ratio_to_fp16 <= 0.3 and p.budget["asked"] == "0.3x"
    assert all(s.k.axis == "channel" for s in p.layers if s.k.bits < 16)
    assert len({(s.k.bits, s.v.bits) for s in p.layers}) <= 2


def test_sensitivity_of_another_model_is_rejected(tiny_dir, tmp_path):
    run(tiny_dir, tmp_path / "a.json", [])
    other = save_tiny(tmp_path / "other", num_hidden_layers=3)
    with pytest.raises(KVTunerError, match="another model"):
        run(other, tmp_path / "b.json", [], sensitivity=tmp_path / "a.sensitivity.json")


def test_budget_below_all_2bit_fails_before_calibration(tiny_dir, tmp_path):
    with pytest.raises(KVTunerError, match="below the cheapest"):
        run(tiny_dir, tmp_path / "c.json", [], budget="0.1x")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "c.sensitivity.json").exists()


def test_bits_choose_the_widths(tiny_dir, tmp_path):
    outcome = run(tiny_dir, tmp_path / "w.json", [], bits=(2, 4, 8))
    used = {b for s in outcome.profile.layers for b in (s.k.bits, s.v.bits)}
    assert used <= {2, 4, 8, 16} and outcome.profile.schema_version == 1
    assert {b.label for b in outcome.baselines} == {"k2v2", "k2v4", "k4v2"}
    sens = tmp_path / "w.sensitivity.json"
    assert json.loads(sens.read_text())["settings"]["bits"] == [2, 4, 8]
    with pytest.raises(KVTunerError, match=r"not \[3\]: calibrate those widths"):
        run(tiny_dir, tmp_path / "x.json", [], sensitivity=sens, bits=(3, 4))
    with pytest.raises(KVTunerError, match="bits must be among"):
        run(tiny_dir, tmp_path / "y.json", [], bits=(7,))
    with pytest.raises(KVTunerError, match=r"below the cheapest configuration \(all 4-bit"):
        run(tiny_dir, tmp_path / "z.json", [], bits=(4, 8))  # 3bit budget < all-4-bit


def test_profile_records_the_device_and_the_study_resumes_across_devices(tiny_dir, tmp_path):
    """A study started elsewhere (here: on a GPU, as its attrs say) resumes on the CPU: the
    device is provenance, not identity. The dtype is identity: bf16 KLs are other numbers."""
    import optuna

    out = tmp_path / "dev" / "profile.json"
    first = run(tiny_dir, out, [], device="cpu", dtype="float32", batch_size=1)
    assert first.profile.calibration["device"] == "cpu"
    assert first.profile.calibration["dtype"] == "float32"
    assert "ran on cpu in float32; peak GPU memory n/a (cpu)" in first.summary
    url = f"sqlite:///{out.with_suffix('.optuna.db')}"
    (name,) = optuna.study.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    assert study.user_attrs["devices"] == ["cpu"] and study.user_attrs["dtype"] == "float32"
    study.set_user_attr("devices", ["cuda:0 (NVIDIA H100 80GB HBM3)"])  # as a GPU run leaves it
    again = run(tiny_dir, out, [], device="auto")
    assert again.trials == first.trials and again.profile.hash == first.profile.hash
    study = optuna.load_study(study_name=name, storage=url)
    assert study.user_attrs["devices"] == ["cuda:0 (NVIDIA H100 80GB HBM3)", "cpu"]
    with pytest.raises(KVTunerError, match="was measured in float32, this run is bfloat16"):
        run(tiny_dir, out, [], dtype="bfloat16")


def test_search_takes_a_loaded_model(tiny_dir, tmp_path):
    """A model built elsewhere (here: the checkpoint in bf16) is searched as is."""
    from kvtuner.calibration import load_model

    loaded = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    outcome = run(tiny_dir, tmp_path / "l.json", [], model="built-in-memory", loaded=loaded)
    assert outcome.profile.model_id == "built-in-memory"
    assert outcome.profile.calibration["dtype"] == "bfloat16"


def test_a_per_token_head_search_writes_one_group_a_row(tiny_dir, tmp_path):
    """The per-head preset resolves to the model's head_dim (32) before calibration."""
    out, logs = tmp_path / "head" / "profile.json", []
    outcome = run(tiny_dir, out, logs, preset="per-token-head-had", budget="4bit")
    profile = load_profile(out, model_fingerprint(str(tiny_dir)))
    head_dim = model_fingerprint(str(tiny_dir)).head_dim
    quantized = [s for layer in profile.layers for s in (layer.k, layer.v) if s.is_quantized]
    assert quantized and {s.group_size for s in quantized} == {head_dim}
    assert {s.rotation for s in quantized} == {"hadamard"}
    assert profile.budget["preset"] == "per-token-head-had" and outcome.best.kl > 0
