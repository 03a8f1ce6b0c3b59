"""Pre-RoPE keys in the pool (``QuantSpec.pre_rope``, channel-axis keys only).

SGLang's attention hands ``set_kv_buffer`` keys after the model's rotary embedding. A pre-RoPE
key side rotates them back to position 0 before it stages and packs them (the bytes the HF
cache stores for the same keys) and forward again on every read, so attention sees the model's
keys up to the quantization error.

The positions come from SGLang itself: before each forward the plugin records
``forward_batch.positions`` for the batch's ``out_cache_loc`` slots in a per-slot table
(:class:`SlotRope`, int32 ``[size + page]``, 4 bytes per token, counted in the cell size). A slot
keeps its position for as long as its K/V stay (radix prefix sharing reuses both together). The
frequencies are the model's own (its SGLang ``RotaryEmbedding``: plain or Llama-3-style neox RoPE,
checked against the module's cos/sin cache), read when SGLang picks the pool class (the model is
loaded by then, so an unsupported RoPE stops start-up in one line).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from ....attention.rope import rope_rotate_at
from ....errors import KVTunerError

__all__ = ["SlotRope", "pre_rope_frequencies", "rotary_frequencies"]

POSITION_BYTES = 4  # int32 per slot


class SlotRope:
    """Each slot's token position (``positions``: int32 [rows]) and the model's rotary
    frequencies ``freq`` (fp32 [R/2], None until bound)."""

    def __init__(self, rows: int, device: torch.device | str) -> None:
        self.positions = torch.zeros(rows, dtype=torch.int32, device=device)
        self.freq: torch.Tensor | None = None

    @classmethod
    def for_layers(
        cls, specs: Sequence[Any], rows: int, device: torch.device | str, freq: torch.Tensor | None
    ) -> SlotRope | None:
        """The table of a pool whose layers ``specs`` store keys pre-RoPE (channel-axis), bound
        to ``freq`` when given (unbound, a write or read is a one-line error); else None."""
        if not any(_pre_rope_pages(s.k) or _pre_rope_pages(s.v) for s in specs):
            return None
        rope = cls(rows, device)
        if freq is not None:
            rope.bind(freq)
        return rope

    def bind(self, freq: torch.Tensor) -> None:
        if freq.ndim != 1 or not len(freq):
            raise KVTunerError("pre-RoPE keys need a 1-D tensor of rotary frequencies")
        self.freq = freq.detach().to(self.positions.device, torch.float32).contiguous()

    def note(self, loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Slots ``loc`` (int [n]) now hold the tokens at ``positions`` (int [n])."""
        if positions.shape != loc.shape:
            raise KVTunerError(
                f"pre-RoPE keys need one position per written slot (1-D RoPE), got positions "
                f"{tuple(positions.shape)} for {tuple(loc.shape)} slots"
            )
        self.positions[loc.long()] = positions.to(torch.int32)

    def note_batch(self, forward_batch: Any) -> None:
        """Before a forward: record the positions of the slots the batch writes."""
        loc, positions = forward_batch.out_cache_loc, forward_batch.positions
        if loc is not None and positions is not None and loc.numel():
            self.note(loc, positions)

    def turn(self, loc: torch.Tensor, x: torch.Tensor, *, forward: bool) -> torch.Tensor:
        """Keys x [n, heads, D] of slots ``loc`` -> fp32, rotated forward to their positions
        (reads) or back to position 0 (writes)."""
        if self.freq is None:
            raise KVTunerError(
                "pre-RoPE keys were written or read before the model's rotary frequencies "
                "were bound (the plugin binds them when it picks the pool class)"
            )
        if 2 * self.freq.shape[0] > x.shape[-1]:
            raise KVTunerError(f"rotary width {2 * self.freq.shape[0]} exceeds head_dim")
        pos = self.positions[loc.long()]
        return rope_rotate_at(x.transpose(0, 1), self.freq, pos, forward=forward).transpose(0, 1)


def rotary_frequencies(model: Any) -> torch.Tensor:
    """The rotary frequencies (fp32 [R/2]) of the one neox-style RoPE module the SGLang model's
    layers share; a one-line error for anything else (several RoPEs, GPT-J style, YaRN, mrope:
    their rotation is not one frequency per channel pair, or not the one kvtuner turns)."""
    ropes = {id(m): m for m in model.modules() if hasattr(m, "cos_sin_cache")}
    if len(ropes) != 1:
        raise KVTunerError(
            f"pre-RoPE keys need one shared rotary embedding in the model, found {len(ropes)}"
        )
    (rope,) = ropes.values()
    name = type(rope).__name__
    compute = getattr(rope, "_compute_inv_freq", None)
    takes_base = compute is not None and "base" in inspect.signature(compute).parameters
    if not getattr(rope, "is_neox_style", False) or not takes_base:
        raise KVTunerError(
            f"pre-RoPE keys need a plain neox-style RoPE (rotate_half pairs, one frequency "
            f"per pair); this model's {name} is not one: serve a profile without pre_rope"
        )
    freq = compute(rope.base).float().cpu()
    _check_against_cache(freq, rope.cos_sin_cache, name)
    return freq


def pre_rope_frequencies(profile: Any, model: Any) -> torch.Tensor | None:
    """The model's rotary frequencies when the profile stores keys pre-RoPE, else None."""
    if not any(spec.k.pre_rope for spec in profile.layers):
        return None
    return rotary_frequencies(model)


def _check_against_cache(freq: torch.Tensor, cache: torch.Tensor, name: str) -> None:
    """cos_sin_cache [positions, R] (cos | sin) must be cos/sin(p·freq) at its dtype's rounding:
    the module applies exactly these frequencies."""
    half = freq.shape[0]
    rows = cache[: min(cache.shape[0], 4096)].float().cpu()
    angle = torch.arange(rows.shape[0])[:, None].float() * freq[None, :]
    want = torch.cat([angle.cos(), angle.sin()], dim=-1)
    tol = max(1e-4, 4 * torch.finfo(cache.dtype).eps)
    if rows.shape[1] != 2 * half or (rows - want).abs().max() > tol:
        raise KVTunerError(
            f"pre-RoPE keys: the frequencies read from {name} do not reproduce its cos/sin "
            "cache; serve a profile without pre_rope"
        )


def _pre_rope_pages(spec: Any) -> bool:
    """Whether a side goes to channel-axis pages that turn its keys (ChannelPages' rope)."""
    return spec.pre_rope and spec.axis == "channel" and spec.is_quantized
