"""The extend kernel (:mod:`kvtuner.attention.extend_kernel`) against the torch reference under
Triton's interpreter at head_dim 64: SGLang's ragged extend (and Tq new tokens a request) over
a paged pool, every format the decode kernel reads; what it leaves to the general kernel."""

from __future__ import annotations

import pytest
import torch
from test_decode_kernel import SPECS, gen, pool

from kvtuner.attention import AttentionBatch, extend_attention, extend_attention_reference
from kvtuner.attention.extend_kernel import ExtendPlan, launch_extend, plan_extend, serves_extend
from kvtuner.quant import QuantSpec
from kvtuner.quant.planes import to_planes

NEW = [5, 1, 0]  # new tokens of each request: several rows, one, none


def ragged(new, heads, seed=0):
    g = gen(seed)
    indptr = torch.zeros(len(new) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(new), 0)
    return torch.randn(int(indptr[-1]), heads, 64, generator=g) * 2, indptr


def matches_reference(q, args, kw, **launch):
    """extend_attention of (q, args, kw) under ``launch`` options, held to the reference."""
    got = extend_attention(q, *args, **kw, **launch)
    want = extend_attention_reference(q, *args, **kw)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    return got


@pytest.mark.parametrize("k_spec,v_spec", SPECS, ids=lambda s: s.short())
def test_ragged_extend_matches_the_reference_for_every_format(k_spec, v_spec):
    args, kw = pool(k_spec, v_spec)  # requests of 150, 1 and 67 stored tokens
    q, indptr = ragged(NEW, 8)
    kw = dict(kw, qo_indptr=indptr, max_q_len=5)
    batch = AttentionBatch(q=q, k_rows=args[0], v_rows=args[1], k_spec=k_spec, v_spec=v_spec, **kw)
    assert serves_extend(batch)
    matches_reference(q, args, kw, block_tokens=16, num_splits=3)


def test_a_window_cap_and_sinks_per_row():
    spec = QuantSpec(4)
    args, kw = pool(spec, spec)
    q, indptr = ragged(NEW, 8, seed=1)
    kw = dict(kw, qo_indptr=indptr, max_q_len=5, window=20, logit_cap=2.0)
    kw["sinks"] = torch.randn(8, generator=gen(2))
    matches_reference(q, args, kw, block_tokens=16, num_splits=2)


def test_equal_counts_run_as_the_ragged_batch_they_are():
    spec = QuantSpec(8, group_size=64)
    args, kw = pool(spec, spec)
    q = torch.randn(3, 1, 4, 64, generator=gen(3)).expand(3, 2, 4, 64).contiguous()
    matches_reference(q, args, kw, block_tokens=16)  # 2 new tokens a request


def test_what_the_extend_kernel_leaves_to_the_general_one():
    spec = QuantSpec(4)
    args, kw = pool(spec, spec)
    q, indptr = ragged(NEW, 4)
    kw = dict(kw, qo_indptr=indptr, max_q_len=5)

    def batch(**change):
        fields = dict(q=q, k_rows=args[0], v_rows=args[1], k_spec=spec, v_spec=spec, **kw)
        return AttentionBatch(**{**fields, **change})

    assert serves_extend(batch())
    assert not serves_extend(batch(rope_freq=torch.ones(32), k_spec=QuantSpec(4, pre_rope=True)))
    # asymmetric 4-bit rows: 64 tokens; rows up to 64 (8-byte rows) or 128 on 8 warps (16-byte
    # rows), cut to the batch's queries × its query heads (here 5 × 2: 16 rows, 4 warps)
    assert args[0].shape[-1] == 40
    assert plan_extend(batch(), 2) == ExtendPlan(2, 16, 64, num_warps=4, num_stages=2)
    assert plan_extend(batch(max_q_len=64), 2) == ExtendPlan(2, 64, 64, num_warps=4, num_stages=2)
    g16 = QuantSpec(4, group_size=16)
    rows16, _ = pool(g16, g16)
    assert rows16[0].shape[-1] == 48  # 16-byte rows
    wide = batch(k_rows=rows16[0], v_rows=rows16[1], k_spec=g16, v_spec=g16)
    assert plan_extend(wide, 2) == ExtendPlan(2, 16, 64, num_warps=4, num_stages=2)
    long = batch(k_rows=rows16[0], v_rows=rows16[1], k_spec=g16, v_spec=g16, max_q_len=64)
    assert plan_extend(long, 2) == ExtendPlan(2, 128, 64, num_warps=8, num_stages=2)
    g32 = QuantSpec(8)  # 72-byte rows as planes: 16-byte copies, the 8-bit tile (64 rows)
    planes8 = [to_planes(r, g32, 64) for r in pool(g32, g32)[0][:2]]
    kv8 = batch(k_rows=planes8[0], v_rows=planes8[1], k_spec=g32, v_spec=g32, max_q_len=64,
                planes=True)  # fmt: skip
    assert kv8.k_vec == 4 and kv8.row_strides("k")[1:] == (144, 64)
    assert plan_extend(kv8, 2) == ExtendPlan(2, 64, 64, num_warps=4, num_stages=2)
    k8 = QuantSpec(8, 16)  # K and V of different widths: 64 rows on 8 warps
    rows8, _ = pool(k8, g16)
    mixed = batch(k_rows=rows8[0], v_rows=rows16[1], k_spec=k8, v_spec=g16, max_q_len=64)
    assert plan_extend(mixed, 2) == ExtendPlan(2, 64, 64, num_warps=8, num_stages=2)
    sym = QuantSpec(4, 8, symmetric=True)  # not wide: 16 rows, 32 tokens at 16-byte rows
    rows_sym, _ = pool(sym, sym)
    narrow = batch(k_rows=rows_sym[0], v_rows=rows_sym[1], k_spec=sym, v_spec=sym, max_q_len=64)
    assert plan_extend(narrow, 2) == ExtendPlan(2, 16, 32, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="power of two"):
        ExtendPlan(1, rows=24)
    contiguous = AttentionBatch(q=q[None, :4], k_rows=args[0][None, :, :].expand(1, -1, -1, -1)
                                .transpose(1, 2), v_rows=args[1][None].transpose(1, 2),
                                k_spec=spec, v_spec=spec)  # fmt: skip
    assert not serves_extend(contiguous)  # the HF cache's rows: the general kernel
    with pytest.raises(ValueError, match="general kernel"):
        launch_extend(contiguous, contiguous.q, ExtendPlan(1))


def in_hand(kw, new, seed):
    """k_new, v_new [N, Hkv, D] unlike what the pool's rows hold for those positions, so a
    kernel that read the rows instead would miss."""
    g = gen(seed)
    n = sum(new)
    return dict(kw, k_new=torch.randn(n, 2, 64, generator=g) * 3, v_new=torch.randn(n, 2, 64))


HAND_SPECS = [SPECS[0], SPECS[4], SPECS[6], SPECS[9]]  # g32, one scale a row, 16-bit K, Hadamard


@pytest.mark.parametrize("k_spec,v_spec", HAND_SPECS, ids=lambda s: s.short())
def test_new_tokens_in_hand_are_attended_from_those_values(k_spec, v_spec):
    args, kw = pool(k_spec, v_spec)
    q, indptr = ragged(NEW, 8, seed=4)
    kw = in_hand(dict(kw, qo_indptr=indptr, max_q_len=5), NEW, seed=5)
    got = matches_reference(q, args, kw, block_tokens=16, num_splits=3)  # splits cross them
    rows_only = {k: x for k, x in kw.items() if k not in ("k_new", "v_new")}
    assert not torch.allclose(got, extend_attention_reference(q, *args, **rows_only), atol=1e-2)


def test_new_tokens_in_hand_with_smoothed_keys_a_window_cap_and_sinks():
    spec = QuantSpec(4)
    args, kw = pool(spec, spec)
    q, indptr = ragged(NEW, 8, seed=6)
    lam = torch.rand(2, 64, generator=gen(7)) + 0.5
    kw = dict(kw, qo_indptr=indptr, max_q_len=5, window=20, logit_cap=2.0, k_smooth=lam)
    kw = in_hand(dict(kw, sinks=torch.randn(8, generator=gen(8))), NEW, seed=9)
    matches_reference(q, args, kw, block_tokens=16, num_splits=2)


def test_the_general_kernel_reads_new_tokens_from_their_rows():
    spec = QuantSpec(4, pre_rope=True)  # pre-RoPE keys at extend: the general kernel
    args, kw = pool(spec, QuantSpec(4))
    q, indptr = ragged(NEW, 8, seed=10)
    kw = dict(kw, qo_indptr=indptr, max_q_len=5, rope_freq=torch.rand(32, generator=gen(13)))
    hand = in_hand(kw, NEW, seed=11)
    got = matches_reference(q, args, hand, block_tokens=16)
    torch.testing.assert_close(got, extend_attention(q, *args, **kw, block_tokens=16))


def test_new_tokens_in_hand_are_checked():
    spec = QuantSpec(4)
    args, kw = pool(spec, spec)
    q, indptr = ragged(NEW, 8)
    fields = dict(q=q, k_rows=args[0], v_rows=args[1], k_spec=spec, v_spec=spec, **kw)
    hand = in_hand({}, NEW, seed=12)
    with pytest.raises(ValueError, match="ragged batches"):  # 2 new tokens a request, not ragged
        AttentionBatch(**dict(fields, q=q.view(3, 2, 8, 64)), **hand)
    ragged_fields = dict(fields, qo_indptr=indptr, max_q_len=5)
    with pytest.raises(ValueError, match="come together"):
        AttentionBatch(**ragged_fields, k_new=hand["k_new"])
    with pytest.raises(ValueError, match=r"\[N, Hkv, D\]"):
        AttentionBatch(**ragged_fields, k_new=hand["k_new"][:, :1], v_new=hand["v_new"][:, :1])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_the_gpus_fp16_path_reads_one_scale_a_token_head_as_top_codes(bits):
    """On a GPU q reaches the extend kernel in 16 bits, and rows of one scale a token-head dot
    their codes read as 1 + c/2**bits (8 bits: 1024 + c), what a code of 0 reads as taken off
    after the dot in fp32 (keys ·Σq, values ·Σ p·s): fp16 q given to :func:`launch_extend`
    runs that path under the interpreter."""
    spec = QuantSpec(bits, group_size=64)
    args, kw = pool(spec, spec)
    q, indptr = ragged(NEW, 8, seed=6)
    kw = dict(kw, qo_indptr=indptr, max_q_len=5)
    batch = AttentionBatch(q=q.half(), k_rows=args[0], v_rows=args[1], k_spec=spec,
                           v_spec=spec, **kw)  # fmt: skip
    got = launch_extend(batch, batch.q, plan_extend(batch, 2))
    want = extend_attention_reference(q.half().float(), *args, **kw)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
