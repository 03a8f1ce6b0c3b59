"""Served tokens against the HF cache running the same profile, teacher-forced (shared by the
server tests of SmolLM2 and Qwen2.5)."""

from __future__ import annotations

import json
import urllib.request

from kvtuner.runtime_loader.hf import cache_kwargs


def generate(server, input_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy ``/generate`` of ``new_tokens`` tokens (EOS may end it sooner)."""
    body = {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens},
    }
    request = urllib.request.Request(
        server.url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.load(reply)["output_ids"]


def prompt_ids(tok, prompt: str) -> list[int]:
    import torch

    chat = [{"role": "user", "content": prompt}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    return (ids if isinstance(ids, torch.Tensor) else ids["input_ids"])[0].tolist()


def forced_deficits(model, profile, ids: list[int], served: list[int]) -> list[float]:
    """Teacher forcing: the HF cache running the same profile is fed the prompt, then the
    served tokens one by one; per step, HF's top logit minus its logit of the served token
    (0 where the server picked HF's argmax)."""
    import torch

    from kvtuner.runtime_loader.hf import make_cache

    # residual_length=1: the filling key block (and the newest token) stay unquantized
    cache, x, out = make_cache(model, profile, residual_length=1), torch.tensor([ids]), []
    with torch.no_grad():
        for token in served:
            logits = model(input_ids=x, **cache_kwargs(cache), use_cache=True).logits[0, -1]
            out.append(float(logits.max() - logits[token]))
            x = torch.tensor([[token]])
    return out
