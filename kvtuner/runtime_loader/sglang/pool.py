"""KVTunerMHATokenToKVPool: SGLang's MHA token pool with each layer's K and V stored packed at
the profile's bits (supported: sglang 0.5.23, see ``version.py``).

Storage: per layer, ``k_buffer[l]: uint8[size + page, heads, k_row_bytes(l)]`` (same for V), the
packed rows of ``kvtuner.quant`` (slot 0's page stays SGLang's padding page). Writes quantize,
pack and scatter (Triton kernels on CUDA, the torch reference on CPU). Reads (``read_mode``):

- ``"lazy"`` (backends that only index ``get_key_buffer(layer)`` with slot ids, e.g. SGLang's
  ``torch_native``): ``get_key_buffer`` returns a :class:`DequantizedView` whose indexing gathers
  and dequantizes just the indexed slots. No scratch; the pool costs its packed bytes only.
  A bounded :class:`DecodeCache` keeps each request's dequantized K/V per layer, so a decode
  step dequantizes only the new token (``decode_cache_tokens`` rows per layer at most; 0: off).
  Requests that do not fit: with the batch announced (:meth:`prepare_reads`), each layer's batch
  is dequantized once and every request's read is a range of it (:class:`BatchReads`).
- ``"scratch"`` (any other backend, e.g. triton, which needs a real tensor with last dim
  head_dim): a layer-sized scratch ``[size + page, heads, head_dim]`` in the model dtype into
  which only the slots of the current batch (announced by :meth:`prepare_reads`) are
  dequantized, once per layer and step.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import KvBufferDesc, MHATokenToKVPool, unwrap_write_loc

from ...errors import KVTunerError
from ...profile import Profile
from ...quant import gather_dequantized, quantize, scatter_quantized
from ...quant.reference import quantize_dequantize
from .batch_reads import BatchReads
from .decode_cache import DEFAULT_DECODE_CACHE_TOKENS, DecodeCache
from .kv_pair import dequantize_pair, pair_spec, quantize_pair, quantize_pair_values
from .sizing import READ_MODES, cell_size
from .support import check_profile_servable, pool_refusal
from .tp_check import check_same_profile, sglang_tp_group
from .view import DequantizedView

logger = logging.getLogger(__name__)

__all__ = ["KVTunerMHATokenToKVPool"]

_PARENT_SIG = inspect.signature(MHATokenToKVPool.__init__)


class KVTunerMHATokenToKVPool(MHATokenToKVPool):
    """``MHATokenToKVPool(*parent_args, profile=..., read_mode=..., tp_group=...)``.

    ``profile`` (a :class:`kvtuner.profile.Profile`, global layer indices) and ``read_mode``
    (``"lazy"`` or ``"scratch"``, see the module doc) default to the class attributes set by
    :meth:`bound` (SGLang constructs pools with the parent's arguments only).
    ``decode_cache_tokens``: the lazy mode's :class:`DecodeCache` bound (rows per layer; 0: off).
    ``tp_group`` is the torch.distributed group whose ranks must hold the same profile (None:
    SGLang's TP CPU group when tensor parallelism is on).
    """

    bound_profile: Profile | None = None
    bound_read_mode: str = "scratch"
    bound_decode_cache_tokens: int = DEFAULT_DECODE_CACHE_TOKENS
    # the quantizer ops (Triton on CUDA, torch on CPU); tests swap in the interpreted kernels
    scatter = staticmethod(scatter_quantized)
    gather = staticmethod(gather_dequantized)

    @classmethod
    def bound(
        cls,
        profile: Profile,
        read_mode: str = "scratch",
        decode_cache_tokens: int = DEFAULT_DECODE_CACHE_TOKENS,
    ) -> type[KVTunerMHATokenToKVPool]:
        """Subclass with the constructor's kvtuner arguments preset, for SGLang's pool factory."""
        attrs = {
            "bound_profile": profile,
            "bound_read_mode": read_mode,
            "bound_decode_cache_tokens": decode_cache_tokens,
        }
        return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})

    def __init__(
        self,
        *args: Any,
        profile: Profile | None = None,
        read_mode: str | None = None,
        decode_cache_tokens: int | None = None,
        tp_group: Any = None,
        **kwargs: Any,
    ) -> None:
        bound = _PARENT_SIG.bind(self, *args, **kwargs)
        bound.apply_defaults()
        self.profile = profile if profile is not None else self.bound_profile
        if self.profile is None:
            raise KVTunerError("KVTunerMHATokenToKVPool needs a profile")
        self.read_mode = read_mode or self.bound_read_mode
        if self.read_mode not in READ_MODES:
            raise KVTunerError(f"read_mode must be one of {READ_MODES}, got {self.read_mode!r}")
        refusal = pool_refusal(bound.arguments)
        if refusal:
            raise KVTunerError(f"the kvtuner pool does not support {refusal} in v1")
        check_profile_servable(self.profile)
        self._check_shape(bound.arguments)
        group = tp_group if tp_group is not None else sglang_tp_group()
        check_same_profile(self.profile.hash, group)
        self._read_slots: torch.Tensor | None = None
        self._materialized: int | None = None
        self._batch = BatchReads()  # lazy mode: the announced batch, dequantized per layer
        self._cache = DecodeCache(0, 0, "cpu")  # off until the parent has sized the pool
        self._last_read: tuple | None = None  # (index tensor, layer, (K, V)) of the last read
        super().__init__(*args, **kwargs)
        if decode_cache_tokens is None:
            decode_cache_tokens = self.bound_decode_cache_tokens
        lazy_cache = decode_cache_tokens if self.read_mode == "lazy" else 0
        self._cache = DecodeCache(lazy_cache, self.size + self.page_size, self.device)
        self._pairs = self._pair_specs()
        self._log_allocation()

    def _pair_specs(self) -> list:
        """Per local layer: the grid K and V share (one quantizer call for both), or None.
        CPU torch path only (the Triton kernels take one tensor per launch)."""
        torch_path = self.scatter is scatter_quantized and self.gather is gather_dequantized
        self._torch_cpu = torch_path and torch.device(self.device).type == "cpu"
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        return [pair_spec(s.k, s.v) if self._torch_cpu else None for s in specs]

    def _check_shape(self, args: dict[str, Any]) -> None:
        fp = self.profile.fingerprint
        start = args.get("start_layer") or 0
        if args["head_dim"] != fp.head_dim:
            raise KVTunerError(
                f"profile head_dim {fp.head_dim} != served head_dim {args['head_dim']}"
            )
        if start + args["layer_num"] > fp.num_layers:
            raise KVTunerError(
                f"pool layers {start}..{start + args['layer_num'] - 1} exceed the "
                f"profile's {fp.num_layers} layers"
            )

    # -- storage -----------------------------------------------------------------------------
    def layer_spec(self, layer_id: int):
        """The profile's LayerSpec of global layer ``layer_id``."""
        return self.profile.layers[layer_id]

    def _rows(self, spec) -> tuple[int, int, int]:
        return (self.size + self.page_size, self.head_num, spec.row_bytes(self.head_dim))

    def _create_buffers(self) -> None:
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        rows = self.size + self.page_size
        zeros = torch.zeros
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            self.k_buffer = [
                zeros(self._rows(s.k), dtype=torch.uint8, device=self.device) for s in specs
            ]
            self.v_buffer = [
                zeros(self._rows(s.v), dtype=torch.uint8, device=self.device) for s in specs
            ]
            self._k_scratch = self._v_scratch = None
            if self.read_mode == "scratch":
                # [rows, heads, head_dim]: last dim stays head_dim for the triton backend
                shape = (rows, self.head_num, self.head_dim)
                self._k_scratch = zeros(shape, dtype=self.dtype, device=self.device)
                self._v_scratch = zeros(shape, dtype=self.dtype, device=self.device)
        self._views = [
            (DequantizedView(self, layer, "k"), DequantizedView(self, layer, "v"))
            for layer in range(self.start_layer, self.start_layer + self.layer_num)
        ]
        self.store_dtype = torch.uint8
        for name in (
            "k_scale_buffer",
            "v_scale_buffer",
            "native_k_scale_buffer",
            "native_v_scale_buffer",
            "dq_k_buffer",
            "dq_v_buffer",
        ):
            setattr(self, name, None)
        self._kv_buffer_descs = self._build_kv_buffer_descs()
        self._init_data_ptrs_and_strides()

    def _build_kv_buffer_descs(self) -> list[KvBufferDesc]:
        """One descriptor per buffer (k0..kL-1, v0..vL-1): row bytes differ per layer."""
        return [
            KvBufferDesc(
                f"{prefix}{i}", tuple(buf.shape), row_bytes=buf[0].numel(), tokens_per_row=1
            )
            for prefix, bufs in (("k", self.k_buffer), ("v", self.v_buffer))
            for i, buf in enumerate(bufs)
        ]

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Packed K and V bytes (the dequant scratch is reported by :meth:`scratch_bytes`)."""
        return (sum(b.numel() for b in self.k_buffer), sum(b.numel() for b in self.v_buffer))

    def scratch_bytes(self) -> int:
        """Bytes of the dequant scratch (0 in lazy read mode)."""
        scratch = (self._k_scratch, self._v_scratch)
        return sum(t.numel() * t.element_size() for t in scratch if t is not None)

    def _log_allocation(self) -> None:
        k, v = self.get_kv_size_bytes()
        predicted = cell_size(
            self.profile,
            heads=self.head_num,
            start_layer=self.start_layer,
            num_layers=self.layer_num,
            dtype_bytes=self.dtype.itemsize,
            read_mode=self.read_mode,
        )
        logger.info(
            "kvtuner pool: profile %s, #tokens: %d, rows: %d, packed KV bytes: %d "
            "(profile predicts %d B/token), read mode %s, dequant scratch bytes: %d, "
            "decode cache: at most %d tokens per layer (%d bytes)",
            self.profile.hash,
            self.size,
            self.size + self.page_size,
            k + v,
            predicted.packed,
            self.read_mode,
            self.scratch_bytes(),
            self._cache.max_tokens,
            self.decode_cache_bound_bytes(),
        )

    def decode_cache_bound_bytes(self) -> int:
        """Most bytes the lazy mode's decode cache can hold (0 when off)."""
        row = 2 * self.head_num * self.head_dim * self.dtype.itemsize  # K and V of one token
        return self._cache.max_tokens * self.layer_num * row

    # -- writes ------------------------------------------------------------------------------
    def set_kv_buffer(
        self,
        layer,
        loc_info,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale=None,
        v_scale=None,
        layer_id_override=None,
        dcp_kv_mask=None,
    ) -> None:
        """Quantize, pack and scatter K/V[N, heads, head_dim] into slots ``loc``.
        (k_scale/v_scale are fp8-cache scales: unused, the pool stores model-dtype input.)"""
        if dcp_kv_mask is not None:
            raise KVTunerError("the kvtuner pool does not support decode context parallelism")
        loc, _, _ = unwrap_write_loc(loc_info)
        self._check_physical_write_loc(loc_info, "set_kv_buffer (kvtuner)")
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        n, idx = loc.shape[0], loc.long()
        self._batch.invalidate()
        self._cache.on_write(layer_id, idx)
        self._last_read = None
        if self._torch_cpu:  # the torch reference; rows and values in one pass
            shape = (n, self.head_num, self.head_dim)
            k_rows, v_rows, k, v = self._quantize(local, spec, cache_k.reshape(shape), cache_v)
            self.k_buffer[local][idx], self.v_buffer[local][idx] = k_rows, v_rows
            if self._cache.enabled:
                self._cache.remember(layer_id, idx, k, v)
        else:
            self._scatter_each(local, spec, loc, cache_k, cache_v)
        if self._materialized == layer_id:
            self._materialized = None

    def _quantize(self, local: int, spec, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Rows of K, V [n, heads, D] and, for the decode cache, the values they dequantize to
        (model dtype; None when the cache is off)."""
        v, shared = v.reshape(k.shape), self._pairs[local]
        if not self._cache.enabled:
            if shared is not None:
                return (*quantize_pair(k, v, spec.k, spec.v, shared), None, None)
            return quantize(k, spec.k), quantize(v, spec.v), None, None
        if shared is not None:
            return quantize_pair_values(k, v, spec.k, spec.v, shared, self.dtype)
        (k_rows, k_hat), (v_rows, v_hat) = (
            quantize_dequantize(x, qs, self.dtype) for x, qs in ((k, spec.k), (v, spec.v))
        )
        return k_rows, v_rows, k_hat, v_hat

    def _scatter_each(self, local: int, spec, loc, cache_k, cache_v) -> None:
        n = loc.shape[0]
        self.scatter(
            self.k_buffer[local], loc, cache_k.reshape(n, self.head_num, self.head_dim), spec.k
        )
        self.scatter(
            self.v_buffer[local], loc, cache_v.reshape(n, self.head_num, self.head_dim), spec.v
        )

    # -- reads -------------------------------------------------------------------------------
    def read_kv(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [len(loc), heads, head_dim] (model dtype) of slots ``loc``."""
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        shared = self._pairs[local]
        if shared is None:
            return self.read_one(layer_id, "k", loc), self.read_one(layer_id, "v", loc)
        idx = loc.long()
        rows = (self.k_buffer[local][idx], self.v_buffer[local][idx])
        return dequantize_pair(*rows, spec.k, spec.v, shared, self.head_dim, self.dtype)

    def read_for_view(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """What a :class:`DequantizedView` returns for ``view[loc]`` (``loc``: int [n]): the
        request's cached rows (new slots dequantized), else a range of the announced batch
        (dequantized once per layer), else a direct read of ``loc``."""
        if self._cache.enabled:
            kv = self._cached_pair(layer_id, loc)
            if kv is not None:
                return kv[0] if which == "k" else kv[1]
        served = self._batch.serve(layer_id, which, loc, self.read_kv)
        return served if served is not None else self.read_one(layer_id, which, loc)

    def _cached_pair(self, layer_id: int, loc: torch.Tensor):
        """The decode cache's (K, V) of ``loc``. torch_native indexes K then V of a layer with
        the same index tensor object: the V read reuses the K read's answer (no write between;
        the caller does not change its index tensor in place between the two reads)."""
        last = self._last_read
        if last is not None and last[0] is loc and last[1] == layer_id:
            return last[2]
        kv = self._cache.serve(layer_id, loc.long(), self.read_kv)
        self._last_read = (loc, layer_id, kv) if kv is not None else None
        return kv

    def read_one(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """Dequantized K (``which="k"``) or V [len(loc), heads, head_dim] of slots ``loc``."""
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        buffers, qs = (self.k_buffer, spec.k) if which == "k" else (self.v_buffer, spec.v)
        return self.gather(buffers[local], loc, qs, self.head_dim, self.dtype)

    def prepare_reads(self, slots: torch.Tensor | None) -> None:
        """Announce the slots the next forward reads, request by request (int64 [n]).
        Scratch mode: only these are dequantized, None forbids reads. Lazy mode: a speed-up
        (one dequantization of the batch per layer); reads work without it."""
        self._read_slots = slots
        self._materialized = None
        self._cache.new_step()
        self._last_read = None
        self._batch.announce(slots if self.read_mode == "lazy" else None)

    def _materialize(self, layer_id: int) -> None:
        if self._materialized == layer_id:
            return
        if self._read_slots is None:
            raise RuntimeError(
                "kvtuner pool: K/V read before the batch's slots were announced (prepare_reads); "
                "this read path is not supported by the v1 pool"
            )
        k, v = self.read_kv(layer_id, self._read_slots)
        self._k_scratch.index_copy_(0, self._read_slots, k)
        self._v_scratch.index_copy_(0, self._read_slots, v)
        self._materialized = layer_id

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "lazy":
            return self._views[layer_id - self.start_layer][0]
        self._materialize(layer_id)
        return self._k_scratch

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "lazy":
            return self._views[layer_id - self.start_layer][1]
        self._materialize(layer_id)
        return self._v_scratch

    def get_kv_buffer_shape(self):
        """Shapes of what the backends read: [rows, heads, head_dim] (not the packed rows)."""
        shape = torch.Size((self.size + self.page_size, self.head_num, self.head_dim))
        return shape, shape

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Slot-to-slot copy of the packed rows (SGLang's); the decode cache is dropped."""
        self._cache.clear()
        self._batch.invalidate()
        self._last_read = None
        super().move_kv_cache(tgt_loc, src_loc)

    def get_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")

    def load_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")
