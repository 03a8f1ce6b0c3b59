"""KVTunerLayer: a transformers cache layer storing one decoder layer's K and V as packed rows."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ...attention.rope import rope_in_kernel
from ...profile import LayerSpec
from .attention import KernelDispatch, tag
from .rope import KeyRope
from .stream import PackedStream


class KVTunerLayer(DynamicLayer):
    """A ``DynamicLayer`` whose K and V live in :class:`PackedStream` objects (own spec each).

    ``update(k, v)`` takes the new states ``[B, H, T, D]`` and returns the whole history as
    attention must read it (dequantized packed rows + the full-precision residual window).
    ``self.keys`` / ``self.values`` expose the unpacked tails only, like ``QuantizedLayer``.
    A decode step that ``dispatch`` sends to the fused kernel returns the new key tagged with
    this layer instead (:mod:`.attention` then calls :meth:`attend`): no history is dequantized.
    Rolling back tokens (``crop``) is not supported: a packed block cannot be partially undone.
    ``rope``: keys are stored pre-RoPE (:mod:`.rope`); the stored key at index i sits at
    position ``first_position + i`` (a sliding-window layer's dropped tokens move it on), and
    ``self.keys`` then holds pre-RoPE keys.
    """

    is_croppable = False

    def __init__(
        self,
        spec: LayerSpec,
        head_dim: int,
        *,
        residual_length: int,
        keep_dequantized: bool,
        pack_chunk: int = 1,
        pack_reserve: int = 0,
        dispatch: KernelDispatch | None = None,
        rope: KeyRope | None = None,
    ):
        super().__init__()
        self.spec = spec
        self.dispatch = dispatch or KernelDispatch("never")
        self.rope = rope
        self.first_position = 0
        self._args = (head_dim, residual_length, keep_dequantized, pack_chunk, pack_reserve)
        self.k = PackedStream(spec.k, *self._args, smoothing=spec.k_smooth)
        self.v = PackedStream(spec.v, *self._args)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k.store(self._to_stored(key_states))
        self.v.store(value_states)
        self.keys, self.values = self.k.tail, self.v.tail
        if self.dispatch.wants(key_states) and self._fusable():
            return tag(key_states, self), value_states  # attention reads this layer
        return self.history(key_states.dtype)

    def _to_stored(self, keys: torch.Tensor) -> torch.Tensor:
        if self.rope is None:
            return keys
        return self.rope.rotate(keys, self.first_position + self.k.num_tokens, forward=False)

    def history(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [B, H, T, D] as attention must read them (dequantized packed rows + tail)."""
        keys = self.k.read(dtype)
        if self.rope is not None:
            keys = self.rope.rotate(keys, self.first_position, forward=True)
        return keys, self.v.read(dtype)

    def _fusable(self) -> bool:
        """The fused kernel reads this layer: token-axis (or 16-bit) values, keys of either
        axis, a power-of-two head_dim >= 16; pre-RoPE keys when the kernel can rotate them."""
        d, v = self.k.head_dim, self.spec.v
        plain_values = v.axis == "token" or not v.is_quantized
        return plain_values and self._rope_fusable() and d >= 16 and not d & (d - 1)

    def _rope_fusable(self) -> bool:
        """No pre-RoPE keys, or keys the kernel rotates per tile: a power-of-two rotary width
        R (it splits tiles into halves of R/2), not Hadamard-rotated (the rotation must act on
        the keys themselves, not on their Hadamard transform)."""
        if self.rope is None:
            return True
        return rope_in_kernel(len(self.rope.inv_freq), self.spec.k, smoothed=False)

    def attend(
        self, q: torch.Tensor, *, starts: torch.Tensor | None, sm_scale: float | None
    ) -> torch.Tensor:
        """Decode attention of q [B, Hq, D] over this layer's packed rows and tail -> [B, Hq, D]."""
        from ...attention import decode_attention

        k, v = self.k, self.v
        rope = {} if self.rope is None else self._rope_args(q.device)
        return decode_attention(
            q, k.rows(), v.rows(), k.spec, v.spec, k_tail=k.attended_tail(),
            v_tail=v.attended_tail(), starts=starts, sm_scale=sm_scale,
            k_smooth=None if k.smoothing is None else k.smoothing.tensor(q.device), **rope,
        )  # fmt: skip

    def _rope_args(self, device: torch.device) -> dict:
        """Pre-RoPE keys: the kernel rotates stored key i to position ``first_position + i``."""
        return dict(rope_freq=self.rope.inv_freq.to(device), rope_offset=self.first_position)

    def get_seq_length(self) -> int:
        return self.k.num_tokens

    def stored_tokens(self) -> int:
        """Tokens a fused step attends: every stored one (a window layer's, before its drop)."""
        return self.k.num_tokens

    def nbytes(self) -> int:
        """Bytes stored by this layer (packed rows; unpacked elements accounted as fp16)."""
        return self.k.nbytes() + self.v.nbytes()

    def reset(self) -> None:
        self.k = PackedStream(self.spec.k, *self._args, smoothing=self.spec.k_smooth)
        self.v = PackedStream(self.spec.v, *self._args)
        self.first_position = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("kvtuner's packed cache cannot crop tokens")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length():
            indices = torch.as_tensor(indices, device=self.device)
            if indices.dtype == torch.bool:
                indices = indices.nonzero().flatten()
            self.k.select(indices)
            self.v.select(indices)
            self.keys, self.values = self.k.tail, self.v.tail

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length():
            self.k.repeat_interleave(repeats)
            self.v.repeat_interleave(repeats)
            self.keys, self.values = self.k.tail, self.v.tail

    def offload(self):  # the packed rows are the point; moving them is not implemented
        raise NotImplementedError("kvtuner's packed cache does not support offloading")
