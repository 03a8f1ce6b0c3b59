"""Tier 2: the real `kvtuner search` on Gemma 3 270M (hybrid) end to end, a few trials."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_search_budgets_window_layers_at_the_context(tmp_path, gemma3):
    from kvtuner.calibration import fingerprint_of
    from kvtuner.profile import load_profile
    from kvtuner.runtime_loader.hf import make_cache

    out = tmp_path / "profile.json"
    args = ["--model", "gemma3-270m", "--budget", "3bit", "--output", str(out)]
    args += ["--num-samples", "1", "--seq-len", "32", "--n-trials", "4", "--no-progress"]
    args += ["--confirm-samples", "0", "--bits", "2,4,8", "--context-length", "8192"]
    env = {**os.environ, "KVTUNER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvtuner", "search", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, _ = gemma3
    fp = fingerprint_of(model)
    profile = load_profile(out, fp)
    assert profile.fingerprint.layout == fp.layout and profile.budget["context_length"] == 8192
    assert (
        profile.nominal_bits <= 3.0 and profile.metrics["kl"] <= profile.metrics["best_uniform_kl"]
    )
    # at 8k the 15 window layers store 511 tokens each: the 3 global layers dominate the bytes
    assert profile.kv_bytes(8192) == pytest.approx(profile.bytes_per_token * 8192)
    make_cache(model, profile, residual_length=0)  # the HF runtime accepts it
