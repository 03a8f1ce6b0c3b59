"""Fused attention over packed KV rows (decode and extend): the public entry points.

``q [B, Tq, Hq, D]``: each request's newest Tq tokens (decode: Tq = 1), already stored, attend
causally to one layer's packed K and V rows and an optional unpacked tail. Codes, scales and
zeros are read and dequantized in registers (never written back), scores and the softmax run in
fp32. Three kernels, each beside its launcher, chosen per call: :mod:`.decode_kernel` (one query
token a request over token-axis rows, pre-RoPE keys included where their rotary halves are at
least 16 channels of whole words: :mod:`.rope_rows`, and KIVI keys in a pool's pages without a
window, pre-RoPE or not), :mod:`.extend_kernel` (new tokens over a paged pool of token-axis
rows or KIVI pages without a window: SGLang's extend), both with fp16 dots
(:mod:`.packed_rows`); :mod:`.kernel`, the general one, for the rest (KIVI keys in the HF
cache or with a window; pre-RoPE keys at extend or of narrower rotary halves; the HF cache's
extend), with dots in q's dtype (what dequantize-then-SDPA does). The inputs are checked once by
:class:`.layout.AttentionBatch`.

Hadamard-rotated keys are attended by rotating q, rotated values by un-rotating the output.
Smoothed keys (rows of ``k / λ``, :mod:`kvtuner.quant.smoothing`) are attended by multiplying q
by λ (and dividing the unpacked tail by it): ``q·k = (q ⊙ λ)·(k / λ)``. Gemma-style layers pass
a sliding ``window`` and a ``logit_cap``; GPT-OSS-style layers pass attention ``sinks``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..quant.reference import hadamard
from ..quant.smoothing import smooth, unsmooth
from ..quant.spec import QuantSpec
from ..quant.triton_kernels import interpreted
from .decode_kernel import DecodePlan, launch_decode, measured_builds, plan_decode, serves
from .extend_kernel import launch_extend, plan_extend, serves_extend
from .kernel import launch
from .layout import AttentionBatch, choose_splits

__all__ = ["attend", "decode_attention", "extend_attention"]


def _rotated(x: torch.Tensor | None, spec: QuantSpec) -> torch.Tensor | None:
    if x is None or spec.rotation != "hadamard" or not spec.is_quantized:
        return x
    return (x.float() @ hadamard(x.shape[-1], x.device)).to(x.dtype)


def _smoothed(q: torch.Tensor, k_tail: torch.Tensor | None, lam: torch.Tensor | None):
    """q [B, Tq, Hq, D] or ragged [N, Hq, D] times λ [Hkv, D] (each query head its KV head's
    row) and the key tail [B, Hkv, Tt, D] divided by it; both unchanged without λ."""
    if lam is None:
        return q, k_tail
    per_q_head = lam.repeat_interleave(q.shape[-2] // lam.shape[0], dim=0)  # [Hq, D]
    q = unsmooth(q, per_q_head, -2, q.dtype)
    if k_tail is not None:
        k_tail = smooth(k_tail, lam, -3).to(k_tail.dtype)
    return q, k_tail


def _new_inputs(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens in hand (k_new, v_new [N, Hkv, D]) as the extend kernel reads them, like
    the tails: keys divided by λ, both rotated into K's and V's basis."""
    k = smooth(batch.k_new, batch.k_smooth, -2).to(batch.k_new.dtype)
    return _rotated(k, batch.k_spec), _rotated(batch.v_new, batch.v_spec)


def _kernel_inputs(batch: AttentionBatch):
    """(q, k_tail, v_tail) as the kernel reads them: smoothed, rotated into K's and V's basis;
    bf16 q becomes fp32 on CPU (the interpreter's numpy has no bf16 ``tl.dot``)."""
    q, k_tail = _smoothed(batch.q, batch.k_tail, batch.k_smooth)
    k_tail, v_tail = _rotated(k_tail, batch.k_spec), _rotated(batch.v_tail, batch.v_spec)
    q = _rotated(q, batch.k_spec)
    if q.dtype == torch.bfloat16 and not q.is_cuda:
        q = q.float()
    return q, k_tail, v_tail


def extend_attention(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    *,
    num_splits: int | None = None,
    block_tokens: int | None = None,
    scale_after_dot: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    max_registers: int | None = None,
    query_rows: int | None = None,
    specialized: bool = True,
    **fields: Any,
) -> torch.Tensor:
    """Causal attention of each request's newest Tq tokens over its packed K/V (and tail)
    -> [B, Tq, Hq, D] (ragged: [N, Hq, D]) in q's dtype.

    q: [B, Tq, Hq, D] (Hq a multiple of the KV heads): the last Tq positions of every request,
    already stored (packed, or in the tail); query i attends positions <= ``total - Tq + i``.
    Rows, one layer's K (``k_spec``) and V:
    - paged: ``k_rows [slots, Hkv, R]``, ``slot_table [rows, W]`` (int32/int64; request b's
      token t lives in slot ``slot_table[table_rows[b], t]``, ``table_rows`` default
      ``arange(B)``), ``lengths [B]`` int32 packed tokens (required);
    - contiguous (HF cache): ``k_rows [B, Hkv, T, R]``, ``lengths`` default T for all.
    Optional keywords (the fields of :class:`.layout.AttentionBatch`, passed on by name; a
    caller holding a batch calls :func:`attend`):
    - ``k_tail`` / ``v_tail``: unpacked tokens ``[B, Hkv, Tt, D]`` after the packed ones;
    - ``starts`` int32 [B]: the request attends positions >= starts[b] (left padding);
    - ragged batches (paged only; SGLang's extend): q ``[N, Hq, D]``, ``qo_indptr [B+1]``
      int32 (request b's queries are rows ``qo_indptr[b]:qo_indptr[b+1]``, its newest tokens)
      and ``max_q_len`` (host int >= every request's count; sizes the grid, no device sync);
    - ``k_new`` / ``v_new`` (ragged): the new tokens' K and V as the model computed them,
      ``[N, Hkv, D]``; the extend kernel attends them from these values (exact, not their
      packed rows) and reads only the prefix from rows; the general kernel reads their rows;
    - ``k_smooth``: fp32 λ [Hkv, D]: the key rows hold ``k / λ`` (the tail holds k);
    - ``sm_scale`` (default D^-0.5); ``window``: a query at position p attends only keys in
      ``(p - window, p]`` (Gemma/HF ``sliding_window``: itself included); ``logit_cap``: scores
      become ``cap · tanh(score / cap)`` before the softmax (Gemma 2); ``sinks`` float [Hq]:
      each head's sink logit joins the softmax denominator (GPT-OSS);
    - paged channel-axis (KIVI) keys: ``k_rows [pages, Hkv, block]`` (page p holds slots
      ``p*G .. p*G+G-1``, G the key group), ``k_stage [rows, G, Hkv, D]`` (fp values of pages
      still filling) and ``k_stage_rows`` int32 [pages] (a page's stage row, -1 once packed);
    - pre-RoPE keys (``QuantSpec.pre_rope``, rows and tail): ``rope_freq`` fp32 [R/2] (the
      model's ``inv_freq``, R <= D a power of two) and ``rope_offset`` (int, or int32 [B]):
      stored key t is rotated forward to position ``rope_offset + t`` (``rotate_half``
      layout, :mod:`.rope`) before its dot; such keys always run element-wise (at decode
      the decode kernel where :func:`.rope_rows.rope_decodable` says, else the general one);
    - ``planes`` (paged): the pool's quantized token rows are laid out as planes, each slot's
      codes of every head before their scales and zeros (:mod:`kvtuner.quant.planes`).
    num_splits (default: from the device, batch and length), block_tokens (default: the decode
    and extend kernels' plans, the general kernel's 64), Triton's num_warps and num_stages,
    max_registers (the decode kernel's cap on registers a thread, ptxas' maxnreg; default:
    fitted at a build's first launch on a GPU, :data:`.decode_kernel.REGISTER_CAPS`; 255: no
    cap; other kernels refuse it) and query_rows (the extend kernel's rows a program:
    new tokens × a KV head's query heads, a power of two >= 16) tune the launch; one query
    token per request over token-axis rows runs the decode kernel (:mod:`.decode_kernel`),
    queries over a paged pool of such rows the extend kernel (:mod:`.extend_kernel`);
    ``specialized=False`` forces the general one, for comparison; ``scale_after_dot`` picks
    the kernel variant (default None: the environment variable
    ``KVTUNER_SCALE_AFTER_DOT=1`` turns it on, else off): on, packed token-axis rows with
    groups >= 16 channels are not dequantized element-wise, their codes go into ``tl.dot``
    and the scales and zeros are applied per group after it (:mod:`.after_dot`).
    Needs CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    """
    batch = AttentionBatch(
        q=q, k_rows=k_rows, v_rows=v_rows, k_spec=k_spec, v_spec=v_spec, **fields
    )  # the other keywords above are AttentionBatch fields, checked there
    return attend(
        batch,
        num_splits=num_splits,
        block_tokens=block_tokens,
        scale_after_dot=scale_after_dot,
        num_warps=num_warps,
        num_stages=num_stages,
        max_registers=max_registers,
        query_rows=query_rows,
        specialized=specialized,
    )


def attend(
    batch: AttentionBatch,
    *,
    num_splits: int | None = None,
    block_tokens: int | None = None,
    scale_after_dot: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    max_registers: int | None = None,
    query_rows: int | None = None,
    specialized: bool = True,
) -> torch.Tensor:
    """The fused attention of one checked batch (build it by keyword) -> [B, Tq, Hq, D]
    (ragged: [N, Hq, D]) in q's dtype; launch options as in :func:`extend_attention`."""
    q = batch.q
    if not q.is_cuda and not interpreted():
        raise ValueError("packed attention needs CUDA tensors, or TRITON_INTERPRET=1 on CPU")
    if block_tokens is not None and (block_tokens < 16 or block_tokens & (block_tokens - 1)):
        raise ValueError(f"block_tokens must be a power of two >= 16, got {block_tokens}")
    inputs, out_dtype = _kernel_inputs(batch), _merged_dtype(batch)
    options = dict(splits=num_splits, block_tokens=block_tokens, num_warps=num_warps,
                   num_stages=num_stages)  # fmt: skip
    options = {k: v for k, v in options.items() if v}  # what the caller set, over the plans'
    if specialized and serves(batch):  # its plan chooses its own splits
        if max_registers is not None:
            options["max_registers"] = max_registers
        measured = measured_builds()
        out = launch_decode(batch, *inputs, _decode_plan(batch, options), out_dtype=out_dtype)
        if measured_builds() > measured:  # this launch measured its build's programs an SM
            # on this GPU, and the next plan splits by them: launch that one now, outside any
            # CUDA-graph capture (a capture cannot load a kernel Triton compiles for it)
            out = launch_decode(batch, *inputs, _decode_plan(batch, options), out_dtype=out_dtype)
    elif max_registers is not None:
        raise ValueError("max_registers caps the decode kernel's registers: this batch runs "
                         "another kernel (see decode_kernel.serves)")  # fmt: skip
    else:
        programs = batch.batch_size * batch.q_tokens  # about: rows of queries per KV head
        splits = num_splits or choose_splits(programs, batch.kv_heads, batch.span, q.device)
        if specialized and serves_extend(batch):
            rows = {"rows": query_rows} if query_rows else {}
            plan = dataclasses.replace(plan_extend(batch, splits), **options, **rows)
            new = None if batch.k_new is None else _new_inputs(batch)
            out = launch_extend(batch, inputs[0], plan, new, out_dtype=out_dtype)
        else:  # new tokens in hand or not, the general kernel reads them from their rows
            tuning = {k: options[k] for k in ("num_warps", "num_stages") if k in options}
            out = launch(batch, *inputs, splits, block_tokens or 64, out_dtype=out_dtype,
                         scale_after_dot=scale_after_dot, **tuning)  # fmt: skip
    return _unrotated(out, batch)


def _decode_plan(batch: AttentionBatch, options: dict[str, Any]) -> DecodePlan:
    """:func:`plan_decode`'s plan with what the caller set over it."""
    plan = plan_decode(batch)
    return dataclasses.replace(plan, **options) if options else plan  # no copy a plain call


def _v_rotated(batch: AttentionBatch) -> bool:
    return batch.v_spec.is_quantized and batch.v_spec.rotation == "hadamard"


def _merged_dtype(batch: AttentionBatch) -> torch.dtype:
    """The dtype every kernel's merge stores: q's on a GPU (an eager step then makes no cast of
    its own), fp32 where V's rotation is still to be undone, and on CPU (the interpreter rounds
    fp32 to bf16 otherwise than torch does)."""
    return batch.q.dtype if _merges_in_q_dtype(batch.q) and not _v_rotated(batch) else torch.float32


def _merges_in_q_dtype(q: torch.Tensor) -> bool:
    """Whether the merge may store q's dtype: on a GPU (``benchmarks/host_cost.py`` says yes
    on CPU too, to time what a GPU call pays)."""
    return q.is_cuda


def _unrotated(out: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """The kernel's output (fp32, or already q's dtype), in V's rotated basis, -> q's dtype in
    the model's basis."""
    q = batch.q
    if _v_rotated(batch):
        out = out @ hadamard(q.shape[-1], q.device)
    return out.to(q.dtype)  # no copy when the merge stored q's dtype


def decode_attention(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """One query token per request, q [B, Hq, D] -> [B, Hq, D]: :func:`extend_attention` with
    Tq = 1 (the query attends every stored position), same arguments."""
    if q.dim() != 3:
        raise ValueError(f"decode q must be [B, Hq, D], got {tuple(q.shape)}")
    return extend_attention(q.unsqueeze(1), *args, **kwargs).squeeze(1)
