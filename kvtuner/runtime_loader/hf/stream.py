"""PackedStream: one layer's K (or V) history as packed rows plus a short full-precision tail.

Layout (B batch, H KV heads, D head_dim, G = spec.group_size):
- ``packed``: uint8, token axis ``[B, H, Tp, row_bytes]``; channel axis
  ``[B, H, Tp/G, block_bytes]`` (whole blocks of G tokens only). The storage of record.
- ``tail``: model dtype ``[B, H, Tt, D]``: the newest tokens, not packed yet. With
  ``residual_length = r > 0`` it holds exactly the last r tokens (token axis), or the last r
  tokens plus the 0..G-1 older tokens of a block still filling up (channel axis); attention
  reads them unquantized. With r = 0 a token-axis tail is always empty, and a channel-axis tail
  holds the < G tokens of the filling block, which attention reads fake-quantized on their own
  statistics (so no query ever reads an unquantized key); they are packed once the block is full.
- ``deq``: optional working copy ``[B, H, Tp, D]`` of ``dequantize(packed)`` in the model dtype,
  extended by only the newly packed tokens, so decode does not re-dequantize the whole history
  every step. It holds exactly the values a fresh dequantize would give (same function, rows).

``pack_chunk`` (token axis): tokens leave the window in chunks of this many, which amortizes the
per-call cost of quantizing during decode; tokens waiting for their chunk are read like the window
(unquantized when r > 0, fake-quantized — identical to packing them — when r = 0).

16-bit specs never pack: the tail keeps the original tensor (exact), whatever ``residual_length``.

Memory: no stored tensor is a view of a larger buffer (see :func:`_own`), so after a prefill and
after every pack the stream holds exactly ``packed`` and ``tail`` (plus ``deq`` when asked for):
what :meth:`PackedStream.nbytes` reports for fp16/bf16 tails. A prefill then keeps no layer's
full-precision K/V once that layer is packed.
"""

from __future__ import annotations

import torch

from ...quant import QuantSpec, dequantize, fake_quantize, quantize_rows
from ...quant.smoothing import KeySmoothing, smooth, unsmooth

FP_ACCOUNTING_BYTES = 2  # unpacked elements are accounted as fp16, the profile's 16-bit format


def _cat(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return _own(b) if a is None or a.shape[-2] == 0 else torch.cat([a, b], dim=-2)


def _own(t: torch.Tensor) -> torch.Tensor:
    """t, or a compact copy of it when t is a view into a larger storage (a slice of the
    prefill's K/V, of a fused qkv projection, of the tail before packing): a view keeps its
    whole storage alive, so the cache would hold far more than :meth:`PackedStream.nbytes`."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone(memory_format=torch.contiguous_format)
    return t


class PackedStream:
    """Packed history + fp tail of one tensor (K or V) of one decoder layer."""

    def __init__(
        self,
        spec: QuantSpec,
        head_dim: int,
        residual_length: int,
        keep_dequantized: bool,
        pack_chunk: int = 1,
        pack_reserve: int = 0,
        smoothing: KeySmoothing | None = None,
    ):
        spec.check_head_dim(head_dim)
        self.spec, self.head_dim = spec, head_dim
        self.smoothing = smoothing  # keys: packed rows hold x / λ (see quant.smoothing)
        self.residual_length = residual_length
        self.keep_dequantized = keep_dequantized
        self.pack_chunk = pack_chunk
        self.pack_reserve = pack_reserve
        self._buffer: torch.Tensor | None = None  # pack_reserve > 0: packed is a prefix of it
        self.packed: torch.Tensor | None = None
        self.tail: torch.Tensor | None = None
        self.deq: torch.Tensor | None = None

    # -- sizes --------------------------------------------------------------------------------
    @property
    def _tokens_per_packed_row(self) -> int:
        return self.spec.group_size if self.spec.axis == "channel" else 1

    @property
    def packed_tokens(self) -> int:
        return 0 if self.packed is None else self.packed.shape[-2] * self._tokens_per_packed_row

    @property
    def tail_tokens(self) -> int:
        return 0 if self.tail is None else self.tail.shape[-2]

    @property
    def num_tokens(self) -> int:
        return self.packed_tokens + self.tail_tokens

    def nbytes(self) -> int:
        """Bytes stored: packed rows as they are, tail elements accounted at 2 bytes (fp16)."""
        packed = 0 if self.packed is None else self.packed.numel()
        tail = 0 if self.tail is None else self.tail.numel() * FP_ACCOUNTING_BYTES
        return packed + tail

    # -- update -------------------------------------------------------------------------------
    def _packable(self) -> int:
        """How many of the oldest tail tokens leave the residual window now."""
        if not self.spec.is_quantized:
            return 0
        unit = self._tokens_per_packed_row if self.spec.axis == "channel" else self.pack_chunk
        over = self.tail_tokens - self.residual_length
        return max(0, over - over % unit)

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Store new tokens x[B, H, T, D]; return the whole history [B, H, T_all, D] as attention
        must read it (model dtype)."""
        self.store(x)
        return self.read(x.dtype)

    def store(self, x: torch.Tensor) -> None:
        """Store new tokens x[B, H, T, D], packing those that leave the residual window."""
        self.tail = _cat(self.tail, x)
        n = self._packable()
        if n:
            chunk = smooth(self.tail[:, :, :n], self._lam(x), -3)
            rows = quantize_rows(chunk, self.spec)  # CUDA: the Triton kernel
            self._append_packed(rows)
            if self.keep_dequantized:
                self.deq = _cat(self.deq, self._dequantize(rows, x.dtype))
            self.tail = _own(self.tail[:, :, n:])

    def rows(self) -> torch.Tensor:
        """Packed rows [B, H, Tp, R] or channel blocks [B, H, Tp/G, R] (possibly none) for the
        fused kernel; needs a stored tail."""
        if self.packed is not None:
            return self.packed
        b, h = self.tail.shape[:2]
        channel = self.spec.axis == "channel" and self.spec.is_quantized
        r = self.spec.block_bytes(self.head_dim) if channel else self.spec.row_bytes(self.head_dim)
        return torch.empty(b, h, 0, r, dtype=torch.uint8, device=self.tail.device)

    def _append_packed(self, rows: torch.Tensor) -> None:
        """``packed += rows``. With ``pack_reserve`` the rows land in spare capacity and the
        history is copied only when the buffer is full (it then grows by ``pack_reserve`` rows
        plus 1/8): decode stops copying the whole history every step, at the price of holding up
        to that much beyond :meth:`nbytes`."""
        if not self.pack_reserve:
            self.packed = _cat(self.packed, rows)
            return
        used = 0 if self.packed is None else self.packed.shape[2]
        need = used + rows.shape[2]
        if self._buffer is None or self._buffer.shape[2] < need:
            grown = rows.new_empty(
                *rows.shape[:2], need + self.pack_reserve + need // 8, rows.shape[3]
            )
            if used:
                grown[:, :, :used] = self.packed
            self._buffer = grown
        self._buffer[:, :, used:need] = rows
        self.packed = self._buffer[:, :, :need]

    def attended_tail(self) -> torch.Tensor | None:
        """The tail as attention reads it: fake-quantized when ``residual_length`` is 0 (a
        filling channel block, tokens waiting for their chunk), else as stored."""
        if self.spec.is_quantized and self.residual_length == 0 and self.tail_tokens:
            lam = self._lam(self.tail)
            fq = fake_quantize(smooth(self.tail, lam, -3), self.spec)
            return fq if lam is None else unsmooth(fq, lam, -3, self.tail.dtype)
        return self.tail

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        tail = self.attended_tail()
        if self.packed is None:
            return tail
        deq = self.deq if self.keep_dequantized else self._dequantize_all(dtype)
        return _cat(deq, tail) if self.tail_tokens else deq

    def _dequantize_all(self, dtype: torch.dtype) -> torch.Tensor:
        return self._dequantize(self.packed, dtype)

    def _lam(self, like: torch.Tensor) -> torch.Tensor | None:
        """λ [H, D] fp32 on ``like``'s device, or None without smoothing."""
        return None if self.smoothing is None else self.smoothing.tensor(like.device)

    def _dequantize(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows [B, H, T, R] as attention reads them: dequantized (and multiplied by λ)."""
        if self.smoothing is None:
            return dequantize(rows, self.spec, self.head_dim, dtype)
        return unsmooth(dequantize(rows, self.spec, self.head_dim), self._lam(rows), -3, dtype)

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest tokens (a sliding window moving on). Token axis only: a channel
        block cannot lose single tokens. The kept rows are copied out, so the dropped ones are
        freed, not held by a view."""
        if self.spec.is_quantized and self.spec.axis == "channel":
            raise ValueError("channel-axis blocks cannot drop single tokens")
        from_packed = min(n, self.packed_tokens)
        for name, count in (
            ("packed", from_packed),
            ("deq", from_packed),
            ("tail", n - from_packed),
        ):
            t = getattr(self, name)
            if t is not None and count:
                setattr(self, name, t[:, :, count:].clone())

    # -- batch surgery for generate() (beam search, contrastive search) -----------------------
    def select(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (also reorders); packed rows move as bytes, no requantize."""
        for name in ("packed", "tail", "deq"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, index.to(t.device)))
        self._buffer = None  # packed is a compact copy now

    def repeat_interleave(self, repeats: int) -> None:
        for name in ("packed", "tail", "deq"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.repeat_interleave(repeats, dim=0))
        self._buffer = None


def predicted_stream_nbytes(
    spec: QuantSpec,
    head_dim: int,
    *,
    tokens: int,
    residual_length: int,
    heads: int,
    batch: int = 1,
    pack_chunk: int = 1,
    kept: int | None = None,
) -> int:
    """What :meth:`PackedStream.nbytes` reports after ``tokens`` tokens, from the spec alone.

    kept: tokens still held when a sliding window dropped the oldest (default: all of them).
    """
    kept = tokens if kept is None else min(kept, tokens)
    if not spec.is_quantized:
        return batch * heads * kept * head_dim * FP_ACCOUNTING_BYTES
    g = spec.group_size if spec.axis == "channel" else pack_chunk
    over = max(0, tokens - residual_length)
    tail = min(kept, tokens - (over - over % g))  # drop_oldest takes packed rows first
    per_token = spec.bytes_per_token(head_dim)
    fp_tail = tail * head_dim * FP_ACCOUNTING_BYTES
    return batch * heads * (round((kept - tail) * per_token) + fp_tail)
