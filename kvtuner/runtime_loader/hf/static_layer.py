"""KVTunerStaticLayer: one decoder layer's K and V packed into slots allocated once, for
``torch.compile`` and CUDA graphs.

Like transformers' ``StaticLayer``, it holds ``max_cache_len`` tokens a request from the first
``update`` on and never reallocates, and its length is a device tensor
(``cumulative_length``), so a compiled decode step neither recompiles nor syncs. Request b's
token t is packed in slot ``b · max_cache_len + t`` of ``uint8 [B · max_cache_len, Hkv, R]``
(the layout of an SGLang pool layer, planes included where they align codes:
:func:`kvtuner.quant.planes.layer_planes`). Every token is quantized before attention reads it
(``residual_length=0``):

- a decode step (one new token a request, ``attn_implementation="kvtuner"``) packs its token
  and :func:`~.attention.kvtuner_attention` reads the slots with the fused kernel
  (``torch.ops.kvtuner``: one opaque call each, :mod:`kvtuner.attention.ops`);
- any other step (prefill) packs its tokens and returns every slot dequantized,
  ``[B, Hkv, max_cache_len, D]``, for the model's attention and its mask (as ``StaticLayer``
  returns its whole buffers).

Served: token-axis or 16-bit K and V, keys stored after RoPE (smoothed and Hadamard-rotated
included); a sliding-window layer keeps every token and its decode reads only the window.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from ...attention.ops import spec_text
from ...errors import KVTunerError
from ...profile import LayerSpec
from ...quant.planes import layer_planes
from ...quant.slot_ops import gather_dequantized
from ...quant.smoothing import smooth, unsmooth
from .attention import KernelDispatch, tag

__all__ = ["KVTunerStaticLayer"]


def _refusal(spec: LayerSpec) -> str | None:
    """Why a static layer cannot store ``spec`` (None: it can)."""
    for name, q in (("k", spec.k), ("v", spec.v)):
        if q.is_quantized and q.axis == "channel":
            return f"layer {spec.layer} {name}: channel-axis (KIVI) blocks"
        if q.pre_rope:
            return f"layer {spec.layer} {name}: pre-RoPE keys"
    return None


class KVTunerStaticLayer(CacheLayerMixin):
    """Packed slots of ``max_cache_len`` tokens a request; pass the cache as
    ``past_key_values`` (``generate`` compiles its decode step where transformers compiles a
    ``StaticCache``'s)."""

    is_compileable = True
    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        spec: LayerSpec,
        head_dim: int,
        *,
        max_cache_len: int,
        window: int | None = None,
        dispatch: KernelDispatch | None = None,
    ):
        super().__init__()
        refused = _refusal(spec)
        if refused:
            raise KVTunerError(f"a static packed cache cannot store {refused}")
        for q in (spec.k, spec.v):
            q.check_head_dim(head_dim)
        self.spec, self.head_dim, self.max_cache_len = spec, head_dim, max_cache_len
        self.window = window
        self.dispatch = dispatch or KernelDispatch("auto")
        self.spec_texts = (spec_text(spec.k), spec_text(spec.v))
        self.cumulative_length = torch.tensor(0, dtype=torch.int64)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the slots for the batch and heads of the first update (never again)."""
        self.device, self.dtype = key_states.device, key_states.dtype
        batch, heads, dim = key_states.shape[0], key_states.shape[1], self.head_dim
        slots = batch * self.max_cache_len
        self.k_rows, self.v_rows = (
            torch.zeros(slots, heads, q.row_bytes(dim), dtype=torch.uint8, device=self.device)
            for q in (self.spec.k, self.spec.v)
        )
        table = torch.arange(slots, dtype=torch.int32, device=self.device)
        self.slot_table = table.view(batch, self.max_cache_len)
        self.cumulative_length = self.cumulative_length.to(self.device)
        self.planes = layer_planes(self.spec.k, self.spec.v, dim, heads)
        lam = self.spec.k_smooth
        self.k_smooth = None if lam is None else lam.tensor(self.device)
        self.kernel = self.dispatch.kernel_on(self.device)
        self.tagged_slots = tag(self.k_rows, self)  # what a fused step hands attention
        if not torch.compiler.is_compiling():  # fixed addresses: CUDA graphs replay them
            for t in (self.k_rows, self.v_rows, self.slot_table, self.cumulative_length):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack new K/V ``[B, Hkv, T, D]`` at the next T positions. A decode step the fused
        kernel reads returns the key slots tagged with this layer (uint8: no other attention
        reads them); any other step returns the history."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        self._check_room(t)
        positions = self.cumulative_length + torch.arange(t, device=self.device)  # [T]
        positions = positions.clamp(max=self.max_cache_len - 1)  # compiled: never another's slot
        loc = (self.slot_table[:, :1] + positions).flatten()  # [B·T] slots, request-major
        k, v = (x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])  # [B·T, Hkv, D]
                for x in (smooth(key_states, self.k_smooth, -3), value_states))  # fmt: skip
        torch.ops.kvtuner.pack_kv_slots(self.k_rows, self.v_rows, loc, k, v, *self.spec_texts,
                                        *self.planes)  # fmt: skip
        self.cumulative_length.add_(t)
        if self.dispatch.fuses(key_states):
            return self.tagged_slots, self.v_rows
        return self.history(key_states.dtype)

    def _check_room(self, tokens: int) -> None:
        """Eager steps (prefill): one line when ``tokens`` more do not fit (a sync; a compiled
        step is not checked, its writes stay within the request's own slots)."""
        if torch.compiler.is_compiling():
            return
        stored = int(self.cumulative_length)
        if stored + tokens > self.max_cache_len:
            raise KVTunerError(
                f"the static cache holds {self.max_cache_len} tokens a request: {stored} stored, "
                f"{tokens} more do not fit (make_cache(..., max_cache_len=N) with a larger N)"
            )

    def history(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every slot dequantized, K and V ``[B, Hkv, max_cache_len, D]`` (unwritten: zeros)."""
        loc, out = self.slot_table.flatten(), []
        k_dtype = dtype if self.k_smooth is None else torch.float32  # λ multiplies in fp32
        for rows, q, planes, to in zip((self.k_rows, self.v_rows), (self.spec.k, self.spec.v),
                                       self.planes, (k_dtype, dtype), strict=True):  # fmt: skip
            x = gather_dequantized(rows, loc, q, self.head_dim, to, planes=planes)
            out.append(x.view(*self.slot_table.shape, *x.shape[1:]).transpose(1, 2))
        return unsmooth(out[0], self.k_smooth, -3, dtype), out[1]

    def attend(self, q: torch.Tensor, *, starts: torch.Tensor | None, sm_scale: float | None):
        """Decode attention of q [B, Hq, D] over the packed slots -> [B, Hq, D]."""
        lengths = self.cumulative_length.to(torch.int32).expand(q.shape[0]).contiguous()
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        return torch.ops.kvtuner.decode_slots(
            q.contiguous(), self.k_rows, self.v_rows, self.slot_table, lengths, starts,
            self.k_smooth, *self.spec_texts, scale, self.window or 0, any(self.planes), self.kernel,
        )  # fmt: skip

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_cache_len, 0

    def stored_tokens(self) -> torch.Tensor:
        """Tokens a fused step attends (a device scalar: compiled steps do not sync)."""
        return self.cumulative_length

    def get_seq_length(self) -> int | torch.Tensor:
        return self.cumulative_length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.max_cache_len

    def nbytes(self) -> int:
        """Bytes held: every slot, written or not."""
        if not self.is_initialized:
            return 0
        return self.k_rows.numel() + self.v_rows.numel()

    def reset(self) -> None:
        if self.is_initialized:
            self.k_rows.zero_()
            self.v_rows.zero_()
        self.cumulative_length.zero_()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("kvtuner's static packed cache cannot crop tokens")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("kvtuner's static packed cache does not reorder requests")

    def offload(self):
        raise NotImplementedError("kvtuner's static packed cache does not support offloading")
