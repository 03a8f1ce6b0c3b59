"""AttentionBatch: what one packed-attention call reads, checked once (shapes, dtypes, devices)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..quant.planes import plannable
from ..quant.spec import QuantSpec
from .rope import check_rope

__all__ = ["AttentionBatch", "choose_splits", "placeholder", "programs_an_sm"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


@dataclass(frozen=True)
class AttentionBatch:
    """The newest Tq tokens of each request (q [B, Tq, Hq, D]) against one layer's packed K
    and V rows.

    Paged (``slot_table`` given): rows ``[slots, Hkv, R]``; request b's token t is in slot
    ``slot_table[table_rows[b], t]``; ``lengths [B]`` int32 is required. Contiguous: rows
    ``[B, Hkv, T, R]``, or for channel-axis keys blocks ``[B, Hkv, T/G, block_bytes]``;
    ``lengths`` (V's packed tokens) defaults to V's T for every request, and must be left out
    when K and V pack different token counts. Tails ``[B, Hkv, Tt, D]`` follow each one's packed
    tokens (K and V end at the same position); ``starts [B]`` int32 masks the positions before
    it (left padding). ``rope_freq``: keys (rows and tail) are stored pre-RoPE, key t of
    request b at position ``rope_offset (+ [b]) + t`` (:mod:`.rope`). ``k_new`` / ``v_new``
    (ragged only): each request's new tokens as the model computed them, float [N, Hkv, D], row
    n the token of q's row n (keys as q sees them: rotated by RoPE, neither smoothed nor
    Hadamard-rotated); where the extend kernel runs the batch (``serves_extend``) they are
    attended from these values and only the prefix from packed rows, elsewhere from their
    rows, which must already hold them. ``planes`` (paged only): the pool's quantized token
    rows are laid out as planes (:mod:`kvtuner.quant.planes`), each slot's codes of every head
    before their scales and zeros; 16-bit rows and KIVI blocks are as ever.
    """

    q: torch.Tensor
    k_rows: torch.Tensor
    v_rows: torch.Tensor
    k_spec: QuantSpec
    v_spec: QuantSpec
    lengths: torch.Tensor | None = None
    slot_table: torch.Tensor | None = None
    table_rows: torch.Tensor | None = None
    k_tail: torch.Tensor | None = None
    v_tail: torch.Tensor | None = None
    starts: torch.Tensor | None = None
    sm_scale: float | None = None
    qo_indptr: torch.Tensor | None = None
    max_q_len: int | None = None
    k_smooth: torch.Tensor | None = None  # fp32 λ [Hkv, D]: key rows hold k / λ
    window: int | None = None  # query at p attends keys in (p - window, p]
    logit_cap: float | None = None  # scores become cap · tanh(score / cap)
    sinks: torch.Tensor | None = None  # float [Hq]: sink logits in the softmax denominator
    k_stage: torch.Tensor | None = None  # paged channel keys: filling pages [rows, G, Hkv, D]
    k_stage_rows: torch.Tensor | None = None  # int32 [pages]: a page's stage row, -1: packed
    rope_freq: torch.Tensor | None = None  # fp32 [R/2]: keys stored pre-RoPE (.rope)
    rope_offset: int | torch.Tensor = 0  # position of stored key 0: int, or int32 [B]
    k_new: torch.Tensor | None = None  # ragged: the new tokens' keys in hand [N, Hkv, D]
    v_new: torch.Tensor | None = None  # and their values
    planes: bool = False  # paged: a slot's codes of every head, then their scales (quant.planes)

    def __post_init__(self) -> None:
        q, ragged = self.q, self.qo_indptr is not None
        layout = "[N, Hq, D]" if ragged else "[B, Tq, Hq, D]"
        if q.dim() != (3 if ragged else 4) or q.dtype not in _FLOATS or q.stride(-1) != 1:
            raise ValueError(
                f"q must be fp16/bf16/fp32 {layout} with contiguous D, got "
                f"{q.dtype} {tuple(q.shape)} strides {q.stride()}"
            )
        dim = self.head_dim
        if q.shape[-3] == 0:
            raise ValueError("q has no query tokens")
        if ragged:
            self._check_ragged()
        if dim < 16 or dim & (dim - 1):
            raise ValueError(f"head_dim must be a power of two >= 16, got {dim}")
        for name, spec in (("k", self.k_spec), ("v", self.v_spec)):
            self._check_rows(name, getattr(self, f"{name}_rows"), spec)
        if self.k_delta and self.lengths is not None:
            raise ValueError("K and V pack different token counts: leave lengths out")
        if self.lengths is None and self.slot_table is None:
            packed = self._packed("v")
            lengths = torch.full((q.shape[0],), packed, dtype=torch.int32, device=q.device)
            object.__setattr__(self, "lengths", lengths)
        self._check_indices()
        self._check_tails()
        self._check_new()
        self._check_smooth()
        self._check_softmax()
        self._check_stage()
        self._check_planes()
        check_rope(self)

    def _check_planes(self) -> None:
        if not self.planes:
            return
        if self.slot_table is None:
            raise ValueError("planes are a paged pool's layout: they need a slot_table")
        for name in ("k", "v"):
            rows = getattr(self, f"{name}_rows")
            if self.in_planes(name) and rows.stride(1) != rows.shape[-1]:
                raise ValueError(
                    f"{name}_rows as planes need a slot's heads adjacent (stride "
                    f"{rows.shape[-1]}), got strides {rows.stride()}"
                )

    def in_planes(self, name: str) -> bool:
        """Whether K's (``"k"``) or V's rows are laid out as planes: quantized token rows
        (:func:`~kvtuner.quant.planes.plannable`) of a batch with ``planes``."""
        return self.planes and plannable(getattr(self, f"{name}_spec"), self.head_dim)

    def row_strides(self, name: str) -> tuple[int, int, int]:
        """Byte strides (request, token, head) of K's (``"k"``) or V's rows' codes: request 0
        when paged; in planes a head's codes follow the previous head's."""
        rows = getattr(self, f"{name}_rows")
        if self.slot_table is None:  # [B, Hkv, T, R]
            return rows.stride(0), rows.stride(2), rows.stride(1)
        if not self.in_planes(name):
            return 0, rows.stride(0), rows.stride(1)
        return 0, rows.stride(0), getattr(self, f"{name}_spec").code_bytes(self.head_dim)

    def _check_stage(self) -> None:
        """Paged channel-axis keys: one block per page of G slots, filling pages staged."""
        stage, rows, spec = self.k_stage, self.k_stage_rows, self.k_spec
        if stage is None and rows is None:
            return
        paged_channel = self.slot_table is not None and spec.axis == "channel"
        if not paged_channel or stage is None or rows is None or self.k_tail is not None:
            raise ValueError(
                "k_stage and k_stage_rows come together, for channel-axis keys in a paged pool "
                "(no tails)"
            )
        want = (stage.shape[0], spec.group_size, self.kv_heads, self.head_dim)
        if tuple(stage.shape) != want or stage.dtype not in _FLOATS or stage.stride(-1) != 1:
            raise ValueError(
                f"k_stage must be float [rows, G, Hkv, D] = {list(want)} with contiguous D, "
                f"got {stage.dtype} {tuple(stage.shape)}"
            )
        pages = self.k_rows.shape[0]
        if rows.dtype != torch.int32 or tuple(rows.shape) != (pages,) or rows.stride(0) != 1:
            raise ValueError(
                f"k_stage_rows must be contiguous int32 [pages] = [{pages}], got {rows.dtype} "
                f"{tuple(rows.shape)}"
            )
        if stage.device != self.q.device or rows.device != self.q.device:
            raise ValueError(f"k_stage and k_stage_rows must be on {self.q.device}")

    def _check_softmax(self) -> None:
        """Window, soft cap and sinks: what changes the softmax beyond the causal mask."""
        w, cap, sinks = self.window, self.logit_cap, self.sinks
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"window must be an int >= 1 (keys a query sees), got {w!r}")
        if cap is not None and not (isinstance(cap, (int, float)) and 0 < cap < float("inf")):
            raise ValueError(f"logit_cap must be a finite number > 0 (or None), got {cap!r}")
        if sinks is None:
            return
        heads, dev = self.q.shape[-2], self.q.device
        if sinks.shape != (heads,) or sinks.dtype not in _FLOATS or sinks.device != dev:
            raise ValueError(
                f"sinks must be float [Hq] = [{heads}] on {dev}, got {sinks.dtype} "
                f"{tuple(sinks.shape)} on {sinks.device}"
            )

    def _check_smooth(self) -> None:
        lam = self.k_smooth
        if lam is None:
            return
        want = (self.kv_heads, self.head_dim)
        if lam.dtype != torch.float32 or tuple(lam.shape) != want or lam.device != self.q.device:
            raise ValueError(
                f"k_smooth must be fp32 {list(want)} on {self.q.device}, got {lam.dtype} "
                f"{list(lam.shape)} on {lam.device}"
            )
        if self.k_spec.axis != "token" or not self.k_spec.is_quantized:
            raise ValueError("k_smooth applies to quantized token-axis keys only")

    def _check_rows(self, name: str, rows: torch.Tensor, spec: QuantSpec) -> None:
        dim, paged = self.head_dim, self.slot_table is not None
        channel = isinstance(spec, QuantSpec) and spec.axis == "channel" and spec.is_quantized
        if not isinstance(spec, QuantSpec):
            raise ValueError(f"{name}_spec must be a QuantSpec, got {spec!r}")
        if channel and (name == "v" or (paged and self.k_stage_rows is None)):
            raise ValueError(
                f"{name}_spec: channel-axis blocks are read for keys only (values are "
                "token-axis); in a paged pool with their staged pages (k_stage, k_stage_rows)"
            )
        want = 3 if paged else 4
        if rows.dtype != torch.uint8 or rows.dim() != want or rows.stride(-1) != 1:
            layout = "[slots, Hkv, R]" if paged else "[B, Hkv, T, R]"
            raise ValueError(
                f"{name}_rows must be uint8 {layout} with contiguous rows, got "
                f"{rows.dtype} {tuple(rows.shape)} strides {rows.stride()}"
            )
        want_bytes = spec.block_bytes(dim) if channel else spec.row_bytes(dim)
        if rows.shape[-1] != want_bytes:
            raise ValueError(
                f"{name}_rows have {rows.shape[-1]} bytes, {spec.short()} at "
                f"head_dim {dim} needs {want_bytes}"
            )
        if not spec.is_quantized and any(s % 2 for s in rows.stride()[:-1]):
            raise ValueError(f"16-bit {name}_rows need even byte strides (fp16 elements)")
        if rows.device != self.q.device:
            raise ValueError(f"{name}_rows are on {rows.device}, q on {self.q.device}")
        heads = self.q.shape[-2]
        if rows.shape[1] == 0 or heads % rows.shape[1]:
            raise ValueError(f"{heads} query heads are not a multiple of {rows.shape[1]} KV heads")
        if rows.shape[1] != self.k_rows.shape[1] or (not paged and rows.shape[0] != len(self.q)):
            raise ValueError(
                f"k_rows {tuple(self.k_rows.shape)} and v_rows "
                f"{tuple(self.v_rows.shape)} do not fit q {tuple(self.q.shape)}"
            )

    def _check_ragged(self) -> None:
        indptr, lengths = self.qo_indptr, self.lengths
        if self.slot_table is None or lengths is None:
            raise ValueError("ragged queries (qo_indptr) need a paged pool: slot_table, lengths")
        want = (lengths.shape[0] + 1,) if lengths.dim() == 1 else None
        if indptr.dtype != torch.int32 or indptr.shape != want or indptr.device != self.q.device:
            raise ValueError(
                f"qo_indptr must be int32 [B+1] = {want} on {self.q.device}, got "
                f"{indptr.dtype} {tuple(indptr.shape)} on {indptr.device}"
            )
        if not isinstance(self.max_q_len, int) or self.max_q_len < 1:
            raise ValueError(f"ragged queries need max_q_len >= 1, got {self.max_q_len!r}")

    def _check_indices(self) -> None:
        bsz, dev = self.batch_size, self.q.device
        paged = self.slot_table is not None
        if paged and (self.slot_table.dim() != 2 or self.slot_table.dtype not in _INTS):
            raise ValueError(
                f"slot_table must be int32/int64 [rows, W], got "
                f"{self.slot_table.dtype} {tuple(self.slot_table.shape)}"
            )
        if paged and self.slot_table.stride(1) != 1:
            raise ValueError("slot_table rows must be contiguous")
        if self.table_rows is not None and not paged:
            raise ValueError("table_rows needs a slot_table")
        for name in ("lengths", "table_rows", "starts"):
            t = getattr(self, name)
            if name == "lengths" and t is None:
                raise ValueError("a paged decode batch needs lengths")
            if t is None:
                continue
            wrong = t.shape != (bsz,) or t.dtype != torch.int32 or t.device != dev
            if wrong or not t.is_contiguous():  # the kernels read element b at b
                raise ValueError(
                    f"{name} must be contiguous int32 [{bsz}] on {dev}, got {t.dtype} "
                    f"{tuple(t.shape)} strides {t.stride()} on {t.device}"
                )

    def _check_tails(self) -> None:
        if (self.k_tail is None) != (self.v_tail is None):
            raise ValueError("k_tail and v_tail come together")
        if self.k_tail is None:
            return
        bsz, dim = self.batch_size, self.head_dim
        for t in (self.k_tail, self.v_tail):
            want = (bsz, self.kv_heads, t.shape[2], dim)
            if t.dim() != 4 or tuple(t.shape) != want or t.stride(3) != 1 or t.dtype not in _FLOATS:
                raise ValueError(
                    f"tails must be float [B, Hkv, Tt, D] = {want} with contiguous D, got "
                    f"{t.dtype} {tuple(t.shape)} strides {t.stride()}"
                )
            if t.device != self.q.device:
                raise ValueError(f"tails are on {t.device}, q on {self.q.device}")
        if self.k_delta + self.k_tail.shape[2] != self.v_tail_tokens:
            raise ValueError(
                f"K ({self._packed('k')} packed + {self.k_tail.shape[2]}) and V "
                f"({self._packed('v')} packed + {self.v_tail_tokens}) must end at the same token"
            )

    def _check_new(self) -> None:
        """The new tokens in hand: K and V together, one row a query row, ragged batches only."""
        k, v = self.k_new, self.v_new
        if k is None and v is None:
            return
        if k is None or v is None or self.qo_indptr is None:
            raise ValueError("k_new and v_new come together, for ragged batches (qo_indptr)")
        want = (self.q.shape[0], self.kv_heads, self.head_dim)
        for x in (k, v):
            if tuple(x.shape) != want or x.dtype not in _FLOATS or x.stride(-1) != 1:
                raise ValueError(
                    f"k_new and v_new must be float [N, Hkv, D] = {list(want)} with contiguous "
                    f"D, got {x.dtype} {tuple(x.shape)} strides {x.stride()}"
                )
            if x.device != self.q.device:
                raise ValueError(f"k_new and v_new are on {x.device}, q on {self.q.device}")

    def _packed(self, name: str) -> int:
        """Packed tokens of K or V (contiguous rows: all requests alike)."""
        rows, spec = (self.k_rows, self.k_spec) if name == "k" else (self.v_rows, self.v_spec)
        per_row = spec.group_size if spec.axis == "channel" and spec.is_quantized else 1
        return rows.shape[2] * per_row

    @property
    def batch_size(self) -> int:
        return self.q.shape[0] if self.qo_indptr is None else self.qo_indptr.shape[0] - 1

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    @property
    def q_tokens(self) -> int:
        """Grid bound of any request's query count: Tq, or ``max_q_len`` when ragged."""
        return self.q.shape[1] if self.qo_indptr is None else self.max_q_len

    @functools.cached_property
    def k_vec(self) -> int:
        """:func:`row_vec` of the key rows (once a batch: every launcher's plan and check asks)."""
        return row_vec(self.k_rows, self.row_strides("k"))

    @functools.cached_property
    def v_vec(self) -> int:
        return row_vec(self.v_rows, self.row_strides("v"))

    @property
    def kv_heads(self) -> int:
        return self.k_rows.shape[1]

    @property
    def k_delta(self) -> int:
        """K's packed tokens minus V's (contiguous rows; 0 in a paged pool)."""
        return 0 if self.slot_table is not None else self._packed("k") - self._packed("v")

    @property
    def max_packed(self) -> int:
        """Upper bound of any request's packed V tokens, known without a device sync."""
        return self.slot_table.shape[1] if self.slot_table is not None else self._packed("v")

    @property
    def span(self) -> int:
        """Upper bound of the packed keys one request's queries attend: the width, or with a
        window at most ``window + Tq - 1`` of them."""
        if self.window is None:
            return self.max_packed
        return min(self.max_packed, self.window + self.q_tokens - 1)

    @property
    def v_tail_tokens(self) -> int:
        return 0 if self.v_tail is None else self.v_tail.shape[2]


def row_vec(rows: torch.Tensor, strides: tuple[int, ...]) -> int:
    """Words every row offset (by byte ``strides``: :meth:`AttentionBatch.row_strides`) is a
    multiple of: 4 (16-byte loads), 2 or 1; 0: rows are not 4-byte aligned (no int32 view)."""
    if rows.shape[-1] % 4:
        return 0
    for vec in (4, 2, 1):
        if rows.data_ptr() % (4 * vec) == 0 and all(s % (4 * vec) == 0 for s in strides):
            return vec
    return 0


def placeholder(q: torch.Tensor, width: int) -> torch.Tensor:
    """A [1, 1, 1, width] view of q (strides a buffer's own, so a kernel's build does not
    change with q's) for a pointer the kernel never reads: no allocation, no fill."""
    return q.as_strided((1, 1, 1, width), (width, width, width, 1))


def choose_splits(
    batch: int,
    kv_heads: int,
    max_tokens: int,
    device: torch.device,
    *,
    sms: int | None = None,
    num_warps: int = 4,
    programs_an_sm: int = 8,
) -> int:
    """Sequence splits per (query rows of a request, KV head), each of at least 256 tokens to
    amortize its reduce; on CPU (interpreter) at most 2. ``sms`` (default: the device's) plans
    a GPU launch anywhere. Tiles of 4-8 warps: about 4 programs an SM. Tiles of one warp
    (``programs_an_sm`` of them fit an SM, by their registers and shared memory): as many as
    two whole waves hold, never a few programs past them. On the H200 (8 one-warp programs an
    SM), KV4 g32 at 16 × 32k ran at 0.85× bf16 SDPA on 4 splits, 1.15-1.16× on 16 (2048
    programs) and 0.96× on 17 (2176: a third wave for 6 %); at 64 × 8k 1.16× on 4 splits,
    1.05× on 5."""
    if sms is None and device.type != "cuda":
        return 1 if max_tokens <= 64 else 2
    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = max(1, batch * kv_heads)
    whole_waves = 2 * programs_an_sm * sms // programs  # one warp: two whole waves
    wanted = whole_waves if num_warps == 1 else -(-4 * sms // programs)
    return max(1, min(wanted, -(-max_tokens // 256), 64))


def programs_an_sm(
    registers: int,
    shared: int,
    num_warps: int,
    *,
    sm_registers: int = 65536,
    sm_shared: int = 233472,
    sm_warps: int = 64,
) -> int:
    """Programs of a kernel one SM holds at once (Hopper's limits by default): registers are
    given out 256 to a warp, each program's shared memory takes 1 KiB more (the driver's), at
    most 32 programs and ``sm_warps`` warps; at least 1."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = sm_registers // per_warp // num_warps
    by_shared = sm_shared // (shared + 1024)
    return max(1, min(by_registers, by_shared, sm_warps // num_warps, 32))
