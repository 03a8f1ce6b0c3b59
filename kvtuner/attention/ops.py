"""Packing into slots and decode over slots as ``torch.library`` ops (``torch.ops.kvtuner``).

``torch.compile`` treats each op as one opaque call: a graph of a decode step holds the pack
of its new tokens and its fused attention without a break, and a CUDA graph captures the
Triton launches inside them (CUDA graphs then replay them with no host work). Specs travel as
JSON text (an op's arguments are tensors and plain values). Registered on import; bodies call
:func:`kvtuner.quant.slot_ops.scatter_kv` and the fused decode kernel, or its torch
reference where ``kernel`` is off (CPU without Triton's interpreter).
"""

from __future__ import annotations

import functools
import json

import torch

from ..quant.slot_ops import scatter_kv
from ..quant.spec import QuantSpec

__all__ = ["decode_slots", "pack_kv_slots", "spec_text"]


def spec_text(spec: QuantSpec) -> str:
    """A spec as an op argument (JSON of its fields)."""
    return json.dumps(spec.to_dict(), sort_keys=True)


@functools.cache
def _spec(text: str) -> QuantSpec:
    return QuantSpec.from_dict(json.loads(text))


@torch.library.custom_op("kvtuner::pack_kv_slots", mutates_args=("k_rows", "v_rows"))
def pack_kv_slots(k_rows: torch.Tensor, v_rows: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, k_spec: str, v_spec: str, k_planes: bool,
                  v_planes: bool) -> None:  # fmt: skip
    """``k_rows[loc] = quantize(k)``, ``v_rows[loc] = quantize(v)`` for k, v [N, Hkv, D]
    (:func:`scatter_kv`: one launch on CUDA)."""
    specs, planes = (_spec(k_spec), _spec(v_spec)), (k_planes, v_planes)
    scatter_kv(k_rows, v_rows, loc, k, v, *specs, planes=planes)


@pack_kv_slots.register_fake
def _(k_rows, v_rows, loc, k, v, k_spec, v_spec, k_planes, v_planes) -> None:
    return None


@torch.library.custom_op("kvtuner::decode_slots", mutates_args=())
def decode_slots(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    slot_table: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor | None,
    k_smooth: torch.Tensor | None,
    k_spec: str,
    v_spec: str,
    sm_scale: float,
    window: int,
    planes: bool,
    kernel: bool,
) -> torch.Tensor:
    """Decode attention of q [B, Hq, D] over a paged layer (rows ``[slots, Hkv, R]``, request
    b's token t in slot ``slot_table[b, t]``, ``lengths`` int32 [B]) -> [B, Hq, D] in q's dtype;
    ``window`` 0: none; ``kernel``: the fused kernel, else its torch reference."""
    from . import decode_attention, decode_attention_reference

    attend = decode_attention if kernel else decode_attention_reference
    out = attend(
        q, k_rows, v_rows, _spec(k_spec), _spec(v_spec), slot_table=slot_table,
        lengths=lengths, starts=starts, k_smooth=k_smooth, sm_scale=sm_scale,
        window=window or None, planes=planes,
    )  # fmt: skip
    return out.to(q.dtype)


@decode_slots.register_fake
def _(q, k_rows, v_rows, slot_table, lengths, starts, k_smooth, k_spec, v_spec, sm_scale, window,
      planes, kernel) -> torch.Tensor:  # fmt: skip
    return torch.empty_like(q)
