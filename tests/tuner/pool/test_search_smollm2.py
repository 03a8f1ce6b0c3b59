"""Tier 2: the real `kvtuner search` on SmolLM2 end to end (small calibration via flags)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_search_end_to_end_profile_validates_and_loads(tmp_path, smollm2):
    from kvtuner.calibration import fingerprint_of
    from kvtuner.profile import load_profile
    from kvtuner.runtime_loader.hf import make_cache

    out = tmp_path / "profile.json"
    args = ["--model", "smollm2-135m", "--budget", "3bit", "--output", str(out)]
    args += ["--num-samples", "1", "--seq-len", "32", "--n-trials", "6", "--no-progress"]
    args += ["--confirm-samples", "0"]  # the written profile is then on the study's Pareto front
    args += ["--pareto-dir", str(tmp_path / "pareto")]
    env = {**os.environ, "KVTUNER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvtuner", "search", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "uniform k4v2" in proc.stdout and "searched" in proc.stdout
    assert "it/s]" not in proc.stderr  # --no-progress: no bar at all, GGUF conversion included
    model, _ = smollm2
    profile = load_profile(out, fingerprint_of(model))
    assert profile.nominal_bits <= 3.0 and profile.budget["asked"] == "3bit"
    assert profile.budget["preset"] == "per-token"
    assert profile.metrics["kl"] <= profile.metrics["best_uniform_kl"]
    assert profile.calibration["tokens"] == 32
    assert all(s.k.rotation == "hadamard" for s in profile.layers if s.k.bits < 16)
    make_cache(model, profile, residual_length=0)  # the HF runtime accepts it
    pareto = json.loads((tmp_path / "pareto" / "pareto.json").read_text())["pareto"]
    assert profile.hash in {p["hash"] for p in pareto}
    # a rerun resumes: the study already holds its trials, so nothing is measured again
    rerun = subprocess.run(
        [sys.executable, "-m", "kvtuner", "search", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert load_profile(out).hash == profile.hash
