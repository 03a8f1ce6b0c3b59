"""SmolLM2-135M rewritten so that SGLang 0.5.23 can split it over 2 ranks, computing the same
function (test-only).

- TP=2: Llama attention needs heads % tp == 0 (``models/llama.py`` asserts it); SmolLM2 has 9
  query and 3 KV heads. One zero KV head and three zero query heads are appended (12 / 4): a
  zero query attends uniformly to zero values, and the added ``o_proj`` columns are zero, so the
  output is unchanged.
- PP=2: with ``tie_word_embeddings`` the last stage's ``lm_head`` is the first stage's
  ``embed_tokens``, a ``PPMissingLayer`` there (``'PPMissingLayer' object has no attribute
  'quant_method'``). ``lm_head.weight`` is written out as a copy of the embedding instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EXTRA_Q, EXTRA_KV = 3, 1


def _pad_rows(w, extra_heads: int, head_dim: int):
    import torch

    return torch.cat([w, w.new_zeros(extra_heads * head_dim, w.shape[1])])


def _rewrite(tensors: dict, head_dim: int) -> dict:
    import torch

    out = {}
    for name, w in tensors.items():
        if name.endswith("self_attn.q_proj.weight"):
            w = _pad_rows(w, EXTRA_Q, head_dim)
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            w = _pad_rows(w, EXTRA_KV, head_dim)
        elif name.endswith("self_attn.o_proj.weight"):
            w = torch.cat([w, w.new_zeros(w.shape[0], EXTRA_Q * head_dim)], dim=1)
        out[name] = w.contiguous()
    out["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    return out


def splittable_copy(src: Path, dst: Path) -> Path:
    """``dst`` (made once): ``src`` with 12 query / 4 KV heads and an untied ``lm_head``."""
    if (dst / "model.safetensors").exists():
        return dst
    from safetensors.torch import load_file, save_file

    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    save_file(_rewrite(tensors, config["head_dim"]), str(tmp / "model.safetensors"))
    config["num_attention_heads"] += EXTRA_Q
    config["num_key_value_heads"] += EXTRA_KV
    config["tie_word_embeddings"] = False
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.rename(dst)
    return dst
