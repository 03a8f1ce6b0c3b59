"""KVTunerMHATokenToKVPool: SGLang's MHA token pool with each layer's K and V stored packed at
the profile's bits (supported: sglang 0.5.23, see ``version.py``).

Storage: per layer, ``k_buffer[l]: uint8[size + page, heads, k_row_bytes(l)]`` (same for V), the
packed rows of ``kvtuner.quant`` (slot 0's page stays SGLang's padding page). Writes quantize,
pack and scatter (:mod:`.pool_writes`: Triton kernels on CUDA; on CPU a numpy writer equal to the
torch reference, or the reference itself). Reads (``read_mode``, :mod:`.pool_reads`):

- ``"lazy"`` (backends that only index ``get_key_buffer(layer)`` with slot ids, e.g. SGLang's
  ``torch_native``): ``get_key_buffer`` returns a :class:`DequantizedView` whose indexing gathers
  and dequantizes just the indexed slots. No scratch; the pool costs its packed bytes only.
  A bounded :class:`DecodeCache` keeps each request's dequantized K/V per layer, so a decode
  step dequantizes only the new token (``decode_cache_tokens`` rows per layer at most; 0: off).
  Requests that do not fit: with the batch announced (:meth:`prepare_reads`), each layer's batch
  is dequantized once and every request's read is a range of it (:class:`BatchReads`).
- ``"packed"`` (the plugin's ``kvtuner`` attention backend, on CUDA): ``get_key_buffer`` and
  :meth:`packed_rows` give the packed uint8 rows; the backend's fused kernels dequantize in
  registers. No scratch, no decode cache, no announced slots (CUDA-graph safe).
- ``"scratch"`` (CPU only: any other backend, which needs a real tensor with last dim
  head_dim; refused on CUDA): a layer-sized scratch ``[size + page, heads, head_dim]`` in the
  model dtype into which only the slots of the current batch (announced by
  :meth:`prepare_reads`) are dequantized, once per layer and step.

Channel-axis (KIVI) sides (page size = their group size) are stored by :class:`ChannelPages`:
``uint8[pages, heads, block_bytes]`` (one channel-axis block per page) plus an fp staging area of
``stage_pages`` filling pages; every read path above reads them through ``read_kv``. Pre-RoPE
channel-axis keys keep a per-slot position table (:mod:`.slot_rope`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import KvBufferDesc, MHATokenToKVPool

from ....errors import KVTunerError
from ....profile import Profile
from ....quant import gather_dequantized, scatter_quantized
from ....quant.slot_ops import pack_channel_pages
from .cell_size import READ_MODES, cell_size
from .channels import PoolChannels
from .cpu_writes.kv_pair import pair_spec
from .layer_ids import pool_layer_ids
from .lazy_reads.batch_reads import BatchReads
from .lazy_reads.decode_cache import DEFAULT_DECODE_CACHE_TOKENS, DecodeCache
from .lazy_reads.view import DequantizedView
from .reads import PoolReads
from .refusals import check_profile_servable, pool_refusal
from .slot_rope import PoolRope
from .smoothing import PoolSmoothing
from .tp_check import check_same_profile, sglang_rank_group
from .writes import PoolWrites

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_STAGE_PAGES", "KVTunerMHATokenToKVPool"]

_PARENT_SIG = inspect.signature(MHATokenToKVPool.__init__)
DEFAULT_STAGE_PAGES = 64  # pools built without the plugin (tests); the plugin sizes it


class KVTunerMHATokenToKVPool(
    PoolReads, PoolWrites, PoolSmoothing, PoolChannels, PoolRope, MHATokenToKVPool
):
    """``MHATokenToKVPool(*parent_args, profile=..., read_mode=..., tp_group=...)``.

    ``profile`` (a :class:`kvtuner.profile.Profile`, global layer indices) and ``read_mode``
    (``"lazy"``, ``"packed"`` or ``"scratch"``, see the module doc) default to the class
    attributes set by :meth:`bound` (SGLang constructs pools with the parent's arguments only).
    ``decode_cache_tokens``: the lazy mode's :class:`DecodeCache` bound (rows per layer; 0: off).
    ``stage_pages``: filling pages the fp staging of channel-axis sides holds (per side).
    ``tp_group`` is the torch.distributed group whose ranks must hold the same profile (None:
    SGLang's TP CPU group when tensor parallelism is on).
    ``layer_ids``: the global (profile) layer id of each of the pool's layers (None:
    ``start_layer`` on; SWAKVPool's sub-pools get theirs bound, see :mod:`.pool_layers`).
    """

    bound_profile: Profile | None = None
    bound_read_mode: str = "scratch"
    bound_decode_cache_tokens: int = DEFAULT_DECODE_CACHE_TOKENS
    bound_stage_pages: int = DEFAULT_STAGE_PAGES
    # global layer ids of the pool's layers (None: start_layer on); SWAKVPool's sub-pools
    bound_layer_ids: tuple[int, ...] | None = None
    # the quantizer ops (Triton on CUDA, torch on CPU); tests swap in the interpreted kernels
    scatter = staticmethod(scatter_quantized)
    gather = staticmethod(gather_dequantized)
    pack_pages = staticmethod(pack_channel_pages)  # full channel-axis (KIVI) pages

    @classmethod
    def bound(
        cls,
        profile: Profile,
        read_mode: str = "scratch",
        decode_cache_tokens: int = DEFAULT_DECODE_CACHE_TOKENS,
        stage_pages: int = DEFAULT_STAGE_PAGES,
        rope_freq: torch.Tensor | None = None,
    ) -> type[KVTunerMHATokenToKVPool]:
        """Subclass with the constructor's kvtuner arguments preset, for SGLang's pool factory
        (``rope_freq``: the model's rotary frequencies, for pre-RoPE keys)."""
        attrs = {
            "bound_profile": profile,
            "bound_read_mode": read_mode,
            "bound_decode_cache_tokens": decode_cache_tokens,
            "bound_stage_pages": stage_pages,
            "bound_rope_freq": rope_freq,
        }
        return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})

    def __init__(
        self,
        *args: Any,
        profile: Profile | None = None,
        read_mode: str | None = None,
        decode_cache_tokens: int | None = None,
        stage_pages: int | None = None,
        tp_group: Any = None,
        layer_ids: tuple[int, ...] | None = None,
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
        check_profile_servable(self.profile, bound.arguments["page_size"])
        self.stage_pages = stage_pages if stage_pages is not None else self.bound_stage_pages
        ids = layer_ids if layer_ids is not None else self.bound_layer_ids
        self.layer_ids = pool_layer_ids(self.profile, bound.arguments, ids)
        group = tp_group if tp_group is not None else sglang_rank_group()
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
        self._lams = self._smoothing_factors()  # key smoothing λ per local layer (or None)
        self._codecs = self._write_codecs()  # after _pair_specs: it sets _torch_cpu
        self._host: dict[int, tuple] = {}  # local layer -> numpy views of its packed buffers
        self.model_layer_ids = self.layer_ids
        self._log_allocation()

    def _pair_specs(self) -> list:
        """Per local layer: the grid K and V share (one quantizer call for both), or None.
        CPU torch path only (the Triton kernels take one tensor per launch)."""
        torch_path = self.scatter is scatter_quantized and self.gather is gather_dequantized
        self._torch_cpu = torch_path and torch.device(self.device).type == "cpu"
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        return [pair_spec(s.k, s.v) if self._torch_cpu else None for s in specs]

    # -- storage -----------------------------------------------------------------------------
    def layer_spec(self, layer_id: int):
        """The profile's LayerSpec of the pool's layer ``layer_id`` (SGLang's id for it: the
        global id, or the sub-pool's own index under SWAKVPool; ``layer_ids`` maps it)."""
        return self.profile.layers[self.layer_ids[layer_id - self.start_layer]]

    def _rows(self, spec) -> tuple[int, int, int]:
        return (self.size + self.page_size, self.head_num, spec.row_bytes(self.head_dim))

    def _create_buffers(self) -> None:
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        rows = self.size + self.page_size
        zeros = torch.zeros
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            sides = [(self._side_buffer(s.k), self._side_buffer(s.v)) for s in specs]
            self.k_buffer = [k[0] for k, _ in sides]
            self.v_buffer = [v[0] for _, v in sides]
            # per local layer: (K pages, V pages) when a side is channel-axis, else None
            self._channel = [(k[1], v[1]) if k[1] or v[1] else None for k, v in sides]
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
        """One descriptor per buffer (k0..kL-1, v0..vL-1): row bytes differ per layer; a
        channel-axis buffer's row is a page's block."""
        return [
            KvBufferDesc(
                f"{prefix}{i}",
                tuple(buf.shape),
                row_bytes=buf[0].numel(),
                tokens_per_row=(self.size + self.page_size) // buf.shape[0],
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
            layer_ids=self.layer_ids,
        )
        logger.info(
            "kvtuner pool: profile %s, layers %s of %d, #tokens: %d, rows: %d, "
            "packed KV bytes: %d "
            "(profile predicts %d B/token), read mode %s, dequant scratch bytes: %d, "
            "decode cache: at most %d tokens per layer (%d bytes), "
            "fp staging: %d filling pages per channel-axis side (%d sides, %d bytes)",
            self.profile.hash,
            _layer_range(self.layer_ids),
            len(self.profile.layers),
            self.size,
            self.size + self.page_size,
            k + v,
            predicted.packed,
            self.read_mode,
            self.scratch_bytes(),
            self._cache.max_tokens,
            self.decode_cache_bound_bytes(),
            self.stage_pages,
            len(self._channel_stores()),
            self.staging_bytes(),
        )

    def decode_cache_bound_bytes(self) -> int:
        """Most bytes the lazy mode's decode cache can hold (0 when off)."""
        row = 2 * self.head_num * self.head_dim * self.dtype.itemsize  # K and V of one token
        return self._cache.max_tokens * self.layer_num * row

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Slot-to-slot copy of the packed rows (SGLang's); the decode cache is dropped."""
        if any(self._channel):
            raise KVTunerError("the kvtuner pool cannot move single slots of channel-axis pages")
        self._cache.clear()
        self._batch.invalidate()
        self._last_read = None
        super().move_kv_cache(tgt_loc, src_loc)

    def get_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")

    def load_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")


def _layer_range(ids: tuple[int, ...]) -> str:
    """``15..29`` for contiguous ids, else the list (a SWAKVPool sub-pool's layers)."""
    if not ids:
        return "none"
    if ids == tuple(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ",".join(map(str, ids))
