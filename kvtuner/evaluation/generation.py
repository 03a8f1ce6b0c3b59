"""Greedy generation through kvtuner's packed cache, with the KV memory it used vs fp16."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..placement import model_device
from ..profile import LayerSpec, Profile
from ..runtime_loader.hf.keyword import cache_kwargs

__all__ = ["Completion", "generate_text"]


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    new_tokens: int
    kv_bytes: int  # what the packed cache stores after the last step
    fp16_bytes: int  # the same tokens in an fp16 cache

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens - 1  # the last token is never cached

    def memory_line(self) -> str:
        return (
            f"KV cache: {self.cached_tokens} tokens, {self.kv_bytes / 1024:.1f} KiB packed vs "
            f"{self.fp16_bytes / 1024:.1f} KiB fp16 ({self.kv_bytes / self.fp16_bytes:.3f}x)"
        )


def _encode(tokenizer: Any, prompt: str, chat: bool) -> torch.Tensor:
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        return ids
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


@torch.inference_mode()
def generate_text(
    model: Any,
    tokenizer: Any,
    prompt: str,
    profile_or_layer_specs: Profile | Sequence[LayerSpec],
    *,
    max_new_tokens: int = 64,
    residual_length: int = 128,
    pack_chunk: int = 32,
    static: bool = False,
    chat: bool = True,
) -> Completion:
    """Greedy completion of ``prompt`` (chat template when the tokenizer has one). ``static``:
    a static packed cache sized for the prompt and ``max_new_tokens`` (every token quantized;
    the window options do not apply), the model switched to kvtuner's attention, so that
    ``generate`` compiles its decode step on CUDA; ``kv_bytes`` is then every slot held."""
    from ..runtime_loader.hf import make_cache, use_kvtuner_attention

    ids = _encode(tokenizer, prompt, chat).to(model_device(model))
    if static:
        capacity = ids.shape[1] + max_new_tokens
        cache = make_cache(use_kvtuner_attention(model), profile_or_layer_specs,
                           max_cache_len=capacity)  # fmt: skip
    else:
        cache = make_cache(
            model, profile_or_layer_specs, residual_length=residual_length, pack_chunk=pack_chunk
        )
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        **cache_kwargs(cache),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    new = out[0, ids.shape[1] :]
    text = tokenizer.decode(new, skip_special_tokens=True)
    held = capacity if static else int(cache.get_seq_length())  # tokens the bytes are for
    return Completion(text, ids.shape[1], len(new), cache.nbytes(), cache.fp16_nbytes(held))
