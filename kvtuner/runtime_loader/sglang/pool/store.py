"""KVTunerMHATokenToKVPool: SGLang's MHA token pool with each layer's K and V stored packed at
the profile's bits (supported: sglang 0.5.23, see ``version.py``).

Storage: per layer, ``k_buffer[l]: uint8[size + page, heads, k_row_bytes(l)]`` (same for V), the
packed rows of ``kvtuner.quant`` (slot 0's page stays SGLang's padding page); a channel-axis
(KIVI) side (page size = its group size) keeps one block per page plus an fp staging area of
``stage_pages`` filling pages. ``read_mode`` picks what backends read: ``"lazy"`` (SGLang's
``torch_native``: views dequantizing just the indexed slots, :class:`ReadState`), ``"packed"``
(the plugin's ``kvtuner`` backend on CUDA: the packed rows, dequantized in its kernels) or
``"scratch"`` (CPU, any other backend: the announced slots dequantized into a layer scratch).

The class holds only the methods SGLang (and the plugin's hooks and backend) call; each
delegates to a part that owns its state, built in :meth:`_create_buffers` and handed what it
needs explicitly: :class:`StoredLayers` (packed buffers, channel-axis page stores, key smoothing's
λ per layer), :class:`SlotRope` (pre-RoPE slot positions), :class:`PackedReads` (dequantization),
:class:`ReadState` (views, scratch, batch and decode caches) and :class:`PoolWriter` (writes).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, unwrap_write_loc

from ....errors import KVTunerError
from ....profile import Profile
from ....quant import gather_dequantized, scatter_kv, scatter_quantized
from ....quant.slot_ops import pack_channel_pages
from .cell_size import READ_MODES, allocation_line
from .channels import buffer_descs
from .geometry import PoolGeometry
from .layer_ids import pool_layer_ids
from .layers import PoolLayers
from .lazy_reads.decode_cache import DEFAULT_DECODE_CACHE_TOKENS
from .lazy_reads.read_plan import ReadPlan
from .lazy_reads.read_state import SlotMap
from .lazy_reads.view import DequantizedView
from .ops import PoolOps
from .parts import build_parts
from .refusals import check_profile_servable, check_same_profile, pool_refusal, sglang_rank_group

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_STAGE_PAGES", "KVTunerMHATokenToKVPool"]

_PARENT_SIG = inspect.signature(MHATokenToKVPool.__init__)
DEFAULT_STAGE_PAGES = 64  # pools built without the plugin (tests); the plugin sizes it
_UNUSED_BUFFERS = ("k_scale_buffer", "v_scale_buffer", "dq_k_buffer", "dq_v_buffer")
_UNUSED_BUFFERS += ("native_k_scale_buffer", "native_v_scale_buffer")  # parent's; None here


class KVTunerMHATokenToKVPool(MHATokenToKVPool):
    """``MHATokenToKVPool(*parent_args, profile=..., read_mode=..., tp_group=...)``.

    ``profile`` (a :class:`kvtuner.profile.Profile`, global layer indices) and ``read_mode``
    (``"lazy"``, ``"packed"`` or ``"scratch"``, see the module doc) default to the class
    attributes set by :meth:`bound` (SGLang constructs pools with the parent's arguments only).
    ``decode_cache_tokens``: the lazy mode's :class:`DecodeCache` bound (rows per layer; 0: off).
    ``stage_pages``: filling pages the fp staging of channel-axis sides holds (per side).
    ``tp_group``: the torch.distributed group whose ranks must hold the same profile (None:
    SGLang's TP CPU group under tensor parallelism). ``layer_ids``: the global layer id of each
    of the pool's layers (None: ``start_layer`` on; SWAKVPool's sub-pools get theirs bound)."""

    bound_profile: Profile | None = None
    bound_read_mode: str = "scratch"
    bound_decode_cache_tokens: int = DEFAULT_DECODE_CACHE_TOKENS
    bound_stage_pages: int = DEFAULT_STAGE_PAGES
    # global layer ids of the pool's layers (None: start_layer on); SWAKVPool's sub-pools
    bound_layer_ids: tuple[int, ...] | None = None
    # the model's rotary frequencies for pre-RoPE keys (unbound: their writes/reads refuse)
    bound_rope_freq: torch.Tensor | None = None
    # the quantizer ops (Triton on CUDA, torch on CPU); tests swap in the interpreted kernels
    scatter = staticmethod(scatter_quantized)
    scatter_kv = staticmethod(scatter_kv)  # a token-axis layer's K and V
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
        if decode_cache_tokens is None:
            decode_cache_tokens = self.bound_decode_cache_tokens
        self.decode_cache_tokens = decode_cache_tokens if self.read_mode == "lazy" else 0
        ids = layer_ids if layer_ids is not None else self.bound_layer_ids
        self.layer_ids = pool_layer_ids(self.profile, bound.arguments, ids)
        group = tp_group if tp_group is not None else sglang_rank_group()
        check_same_profile(self.profile.hash, group)
        super().__init__(*args, **kwargs)  # calls _create_buffers, which builds the parts
        self.model_layer_ids = self.layer_ids
        logger.info(allocation_line(self))

    # -- storage: SGLang's allocation point builds the parts ---------------------------------
    def layer_spec(self, layer_id: int):
        """The profile's LayerSpec of the pool's layer ``layer_id`` (SGLang's id for it: the
        global id, or the sub-pool's own index under SWAKVPool; ``layer_ids`` maps it)."""
        return self.profile.layers[self.layer_ids[layer_id - self.start_layer]]

    def _create_buffers(self) -> None:
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            self._parts = build_parts(
                self._pool_layers(), self._pool_geometry(), self._pool_ops(), self._read_plan()
            )
        self.k_buffer = self._parts.stored.k_buffer
        self.v_buffer = self._parts.stored.v_buffer
        self.store_dtype = torch.uint8
        for name in _UNUSED_BUFFERS:
            setattr(self, name, None)
        rows = self.size + self.page_size
        self._kv_buffer_descs = buffer_descs(self.k_buffer, self.v_buffer, rows)
        self._init_data_ptrs_and_strides()

    def _pool_layers(self) -> PoolLayers:
        specs = tuple(self.layer_spec(self.start_layer + i) for i in range(self.layer_num))
        heads = self.profile.fingerprint.num_kv_heads
        return PoolLayers(specs, self.start_layer, heads, rope_freq=self.bound_rope_freq)

    def _pool_geometry(self) -> PoolGeometry:
        return PoolGeometry(
            rows=self.size + self.page_size,
            page=self.page_size,
            heads=self.head_num,
            head_dim=self.head_dim,
            dtype=self.dtype,
            device=self.device,
            stage_pages=self.stage_pages,
        )

    def _pool_ops(self) -> PoolOps:
        """The class's quantizer ops; ``torch_cpu`` when they are the torch reference on CPU."""
        torch_path = self.scatter is scatter_quantized and self.gather is gather_dequantized
        cpu = torch_path and torch.device(self.device).type == "cpu"
        return PoolOps(self.scatter, self.scatter_kv, self.gather, self.pack_pages, torch_cpu=cpu)

    def _read_plan(self) -> ReadPlan:
        views = self._views() if self.read_mode == "lazy" else {}
        return ReadPlan(
            self.read_mode, self.decode_cache_tokens, self.read_kv, self.read_one, views=views
        )

    def _views(self) -> dict[int, tuple[DequantizedView, DequantizedView]]:
        layers = range(self.start_layer, self.start_layer + self.layer_num)
        return {i: (DequantizedView(self, i, "k"), DequantizedView(self, i, "v")) for i in layers}

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Packed K and V bytes (the dequant scratch is reported by :meth:`scratch_bytes`)."""
        return (sum(b.numel() for b in self.k_buffer), sum(b.numel() for b in self.v_buffer))

    def scratch_bytes(self) -> int:
        """Bytes of the dequant scratch (0 in lazy read mode)."""
        return self._parts.reads.scratch_bytes()

    def staging_bytes(self) -> int:
        """Bytes of the fp staging of channel-axis sides (0 without them)."""
        return self._parts.stored.channels.staging_bytes()

    def decode_cache_bound_bytes(self) -> int:
        """Most bytes the lazy mode's decode cache can hold (0 when off)."""
        row = 2 * self.head_num * self.head_dim * self.dtype.itemsize  # K and V of one token
        return self._parts.reads.cache.max_tokens * self.layer_num * row

    # -- reads ---------------------------------------------------------------------------------
    def read_kv(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [len(loc), heads, head_dim] (model dtype) of slots ``loc``."""
        return self._parts.packed.read_kv(layer_id - self.start_layer, loc)

    def read_one(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """Dequantized K (``which="k"``) or V [len(loc), heads, head_dim] of slots ``loc``."""
        return self._parts.packed.read_one(layer_id - self.start_layer, which, loc)

    def read_for_view(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """What a :class:`DequantizedView` returns for ``view[loc]`` (see :class:`ReadState`)."""
        return self._parts.reads.for_view(layer_id, which, loc)

    def prepare_reads(self, slots: torch.Tensor | None) -> None:
        """Announce the slots the next forward reads, request by request (int64 [n]).
        Scratch mode: only these are dequantized, None forbids reads. Lazy mode: a speed-up."""
        self._parts.reads.prepare(slots)

    @property
    def read_slot_map(self) -> SlotMap | None:
        """Full-pool slots -> this pool's slots, for reads (SWAKVPool's window sub-pool)."""
        return self._parts.reads.slot_map

    @read_slot_map.setter
    def read_slot_map(self, slot_map: SlotMap | None) -> None:
        self._parts.reads.slot_map = slot_map

    def packed_rows(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_id``'s packed K and V rows, uint8 ``[size + page, heads, row_bytes]``."""
        local = layer_id - self.start_layer
        return self.k_buffer[local], self.v_buffer[local]

    def packed_planes(self, layer_id: int) -> bool:
        """Whether layer ``layer_id``'s packed rows are laid out as planes (the attention
        kernels' ``planes``; :mod:`kvtuner.quant.planes`)."""
        return any(self._parts.stored.planes[layer_id - self.start_layer])

    def storage_layout(self) -> str:
        """``"planes"`` where some layer's rows are laid out as planes, else ``"rows"``: what
        a page of this pool's bytes means (HiCache's storage keys name it)."""
        return "planes" if any(any(p) for p in self._parts.stored.planes) else "rows"

    def channel_keys(self, layer_id: int):
        """Layer ``layer_id``'s channel-axis key pages (:class:`ChannelPages`: blocks, staged
        filling pages and their device ``stage_rows``), or None for token-axis keys."""
        return self._parts.stored.channels.side(layer_id - self.start_layer, "k")

    def key_smoothing(self, layer_id: int) -> torch.Tensor | None:
        """fp32 λ [heads, D] of global layer ``layer_id`` (its packed keys hold k / λ), or None."""
        return self._parts.stored.lambdas.factor(layer_id - self.start_layer)

    def rope_freq(self, layer_id: int) -> torch.Tensor | None:
        """fp32 [R/2] for a layer whose keys are stored pre-RoPE (the kernels' ``rope_freq``)."""
        rope = self._parts.rope
        return None if rope is None or not self.layer_spec(layer_id).k.pre_rope else rope.freq

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "packed":
            return self.packed_rows(layer_id)[0]
        return self._parts.reads.buffer(layer_id, "k")

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "packed":
            return self.packed_rows(layer_id)[1]
        return self._parts.reads.buffer(layer_id, "v")

    def get_kv_buffer_shape(self):
        """Shapes of what the backends read: [rows, heads, head_dim] (not the packed rows)."""
        shape = torch.Size((self.size + self.page_size, self.head_num, self.head_dim))
        return shape, shape

    # -- writes and the allocator's notices ----------------------------------------------------
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
        self._parts.writer.write(layer_id, loc, cache_k, cache_v)

    def note_positions(self, forward_batch: Any) -> None:
        """Before a forward: record the positions of the slots the batch writes."""
        if self._parts.rope is not None:
            self._parts.rope.note_batch(forward_batch)

    def on_rows_loaded(self, local_layer: int, slots: torch.Tensor) -> None:
        """HiCache loaded packed rows from host into ``slots`` (int64 [n]) of local layer
        ``local_layer``: what reads cached of those slots is stale."""
        self._parts.reads.on_rows_loaded(self.start_layer + local_layer, slots)

    def release_pages(self, *page_ids: torch.Tensor) -> None:
        """SGLang's allocator freed these pages: drop their staged (filling) values."""
        self._parts.stored.channels.release(*page_ids)

    def clear_staging(self) -> None:
        """SGLang's allocator was cleared: no page is filling."""
        self._parts.stored.channels.clear()

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Slot-to-slot copy of the packed rows (SGLang's); the decode cache is dropped."""
        if self._parts.stored.channels.any():
            raise KVTunerError("the kvtuner pool cannot move single slots of channel-axis pages")
        self._parts.reads.drop()
        super().move_kv_cache(tgt_loc, src_loc)

    def get_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")

    def load_cpu_copy(self, *args, **kwargs):
        raise KVTunerError("the kvtuner pool does not support KV CPU offload in v1")
