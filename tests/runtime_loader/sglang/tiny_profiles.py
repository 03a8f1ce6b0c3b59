"""Profiles for the SGLang tier: tiny LLaMA-shaped ones, and SmolLM2 ones from its HF config."""

from __future__ import annotations

from pathlib import Path

import torch

from kvtuner.profile import LayerSpec, ModelFingerprint, Profile
from kvtuner.quant import QuantSpec


def tiny_profile(specs, *, heads: int = 2, head_dim: int = 64) -> Profile:
    """Profile over len(specs) layers; specs = [(k_spec, v_spec), ...]."""
    fp = ModelFingerprint("LlamaForCausalLM", len(specs), heads, head_dim)
    return Profile("tiny", fp, tuple(LayerSpec(i, k, v) for i, (k, v) in enumerate(specs)))


def model_profile(model_dir: Path, k: QuantSpec, v: QuantSpec) -> Profile:
    """Uniform profile fitted to the HF model folder's config."""
    import transformers

    fp = ModelFingerprint.from_config(transformers.AutoConfig.from_pretrained(model_dir))
    return Profile.uniform(Path(model_dir).name, fp, k, v)


def pool_over(profile: Profile, size: int, *, cls=None, page_size: int = 1,
              dtype=torch.float32, head_num: int | None = None, **kw):  # fmt: skip
    """A kvtuner pool (or subclass ``cls``) of ``size`` slots on CPU shaped by the profile
    (``head_num``: the KV heads one rank holds, default all)."""
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    fp = profile.fingerprint
    heads = head_num or fp.num_kv_heads
    return (cls or KVTunerMHATokenToKVPool)(
        size, page_size=page_size, dtype=dtype, head_num=heads, head_dim=fp.head_dim,
        layer_num=len(profile.layers), device="cpu", enable_memory_saver=False, profile=profile,
        **kw,
    )  # fmt: skip
