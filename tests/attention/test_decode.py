"""Fused decode attention vs the torch reference (dequantize, then SDPA), under TRITON_INTERPRET."""

from __future__ import annotations

import pytest
import torch

from kvtuner.attention import (
    decode_attention,
    decode_attention_reference,
    extend_attention,
    extend_attention_reference,
)
from kvtuner.attention.after_dot import ENV, takes_after_dot, wanted
from kvtuner.quant import QuantSpec, quantize
from kvtuner.quant.planes import plannable, to_planes

pytestmark = pytest.mark.usefixtures("attention_variant")  # both kernel variants

D = 32
RAGGED = [70, 1, 37]  # several tiles and splits, a length-1 request, a partial tile


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def paged_pool(lengths, kv_heads, k_spec, v_spec, seed=0, slots=160):
    """A pool [slots, Hkv, R] per K and V, and a slot table scattering each request's tokens."""
    g = gen(seed)
    k = torch.randn(slots, kv_heads, D, generator=g) * 2
    v = torch.randn(slots, kv_heads, D, generator=g)
    table = scattered_table(lengths, slots, g)
    lens = torch.tensor(lengths, dtype=torch.int32)
    return quantize(k, k_spec), quantize(v, v_spec), table, lens


def scattered_table(lengths, slots: int, g: torch.Generator) -> torch.Tensor:
    """int32 [requests, max length]: request b's tokens in distinct random slots of ``slots``."""
    perm = torch.randperm(slots, generator=g)
    table = torch.zeros(len(lengths), max(lengths), dtype=torch.int32)
    used = 0
    for b, n in enumerate(lengths):
        table[b, :n] = perm[used : used + n]
        used += n
    return table


def pool_args(lengths, kv_heads, k_spec, v_spec, seed=0):
    """(rows and specs, index keywords) of a paged pool holding requests of ``lengths``."""
    k_rows, v_rows, table, lens = paged_pool(lengths, kv_heads, k_spec, v_spec, seed)
    return (k_rows, v_rows, k_spec, v_spec), dict(lengths=lens, slot_table=table)


def both(q, *args, tol=2e-5, **kwargs):
    """Kernel and reference outputs (decode for q [B, Hq, D], extend for [B, Tq, Hq, D])."""
    fused, reference = (
        (decode_attention, decode_attention_reference)
        if q.dim() == 3
        else (extend_attention, extend_attention_reference)
    )
    got = fused(q, *args, **kwargs)
    ref = reference(q, *args, **kwargs)
    assert got.shape == ref.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol, equal_nan=True)
    return got, ref


@pytest.mark.parametrize(
    "k_spec,v_spec",
    [
        (QuantSpec(2), QuantSpec(2, group_size=16, symmetric=True)),
        (QuantSpec(3, group_size=16), QuantSpec(3, symmetric=True)),
        (QuantSpec(4), QuantSpec(4, symmetric=True)),
        (QuantSpec(5, symmetric=True), QuantSpec(5, group_size=8)),
        (QuantSpec(6), QuantSpec(6, group_size=16)),
        (QuantSpec(8, symmetric=True), QuantSpec(8)),
        (QuantSpec(16), QuantSpec(16)),
        (QuantSpec(4, group_size=16), QuantSpec(16)),  # a mixed layer
    ],
    ids=lambda s: s.short(),
)
def test_every_bit_width_on_a_paged_pool_with_ragged_lengths(k_spec, v_spec):
    args, index = pool_args(RAGGED, 2, k_spec, v_spec)
    q = torch.randn(3, 8, D, generator=gen(1))
    both(q, *args, **index, block_tokens=16, num_splits=3)


@pytest.mark.parametrize("ratio", [1, 4, 8])
def test_gqa_ratios(ratio):
    spec = QuantSpec(4)
    k_rows, v_rows, table, lens = paged_pool([40, 9], 2, spec, spec, seed=ratio)
    q = torch.randn(2, 2 * ratio, D, generator=gen(2))
    both(q, k_rows, v_rows, spec, spec, lengths=lens, slot_table=table, block_tokens=16)


def test_table_rows_pick_each_requests_row_of_a_shared_table():
    spec = QuantSpec(8)
    k_rows, v_rows, table, lens = paged_pool([20, 33, 5], 1, spec, spec)
    rows = torch.tensor([2, 0], dtype=torch.int32)  # SGLang: req_to_token[req_pool_indices]
    q = torch.randn(2, 2, D, generator=gen(3))
    got, _ = both(
        q, k_rows, v_rows, spec, spec, lengths=lens[rows.long()], slot_table=table, table_rows=rows
    )
    direct = decode_attention(
        q, k_rows, v_rows, spec, spec, lengths=lens[rows.long()], slot_table=table[rows.long()]
    )
    assert torch.equal(got, direct)


def stored_rows(k_spec, v_spec, k_packed, v_packed, tokens, bsz=2, seed=0):
    """The HF cache's layout: (rows [B, 2, T, R] or K blocks and specs, tail keywords); K and V
    pack their first k_packed / v_packed of ``tokens`` and keep the rest in their tails."""
    g = gen(seed)
    k, v = (torch.randn(bsz, 2, tokens, D, generator=g) for _ in range(2))
    rows = quantize(k[:, :, :k_packed], k_spec), quantize(v[:, :, :v_packed], v_spec)
    return (*rows, k_spec, v_spec), dict(k_tail=k[:, :, k_packed:], v_tail=v[:, :, v_packed:])


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_contiguous_rows_with_a_tail_and_left_padding(rotation):
    k_spec, v_spec = QuantSpec(4, rotation=rotation), QuantSpec(3, rotation=rotation)
    args, tails = stored_rows(k_spec, v_spec, 45, 45, 50, bsz=3)
    q = torch.randn(3, 4, D, generator=gen(4))
    starts = torch.tensor([0, 7, 47], dtype=torch.int32)  # request 2: padding into the tail
    both(q, *args, **tails, starts=starts, block_tokens=16, num_splits=2)


def test_a_tail_alone_and_a_request_with_nothing_to_attend():
    spec = QuantSpec(4)
    args, tails = stored_rows(spec, spec, 16, 16, 21)
    q = torch.randn(2, 4, D, generator=gen(5))
    lens = torch.tensor([0, 16], dtype=torch.int32)
    both(q, *args, **tails, lengths=lens)
    got, _ = both(q, *args, lengths=lens)
    assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_queries_match_within_half_rounding(dtype):
    """bf16 runs as fp32 on CPU; fp16 dots fp16 (scale-after-dot: codes by the 0x6400 trick)."""
    k_spec, v_spec = QuantSpec(4), QuantSpec(8, group_size=16, symmetric=True)
    k_rows, v_rows, table, lens = paged_pool(RAGGED, 2, k_spec, v_spec)
    q = torch.randn(3, 8, D, generator=gen(6)).to(dtype)
    both(q, k_rows, v_rows, k_spec, v_spec, lengths=lens, slot_table=table, tol=3e-2)


@pytest.mark.parametrize("v_group", [8, 16])  # 16: values scaled after the dot too
def test_nan_poisoned_groups_stay_local(v_group):
    k_spec, v_spec = QuantSpec(4), QuantSpec(4, group_size=v_group)
    k_rows, v_rows, table, lens = paged_pool(RAGGED, 2, k_spec, v_spec)
    nan = torch.tensor([0x00, 0x7E], dtype=torch.uint8)  # fp16 NaN, little-endian
    at = k_spec.code_bytes(D)
    k_rows[table[0, 50], 0, at : at + 2] = nan  # the scale of a key group of request 0
    at = v_spec.code_bytes(D) + 2
    v_rows[table[2, 3], 1, at : at + 2] = nan  # the 2nd value group's scale, request 2
    unused = sorted(set(range(160)) - set(table.flatten().tolist()))[0]
    table[1, 5] = unused  # beyond request 1's length: never read
    k_rows[unused, :, :] = 0xFF
    q = torch.randn(3, 8, D, generator=gen(7))
    args = (k_rows, v_rows, k_spec, v_spec)
    got, _ = both(q, *args, lengths=lens, slot_table=table, block_tokens=16, num_splits=3)
    nan = got.isnan()
    assert nan[0, :4].all() and not nan[0, 4:].any()  # K: every query head of KV head 0
    channels = slice(v_group, 2 * v_group)  # V: that group's channels, KV head 1
    assert nan[2, 4:, channels].all() and nan[2].sum() == 4 * v_group
    assert not nan[1].any()


@pytest.mark.parametrize("ratio", [1, 8])
def test_extend_attends_the_packed_prefix_and_itself_causally(ratio):
    k_spec, v_spec = QuantSpec(4), QuantSpec(3, group_size=16, symmetric=True)
    args, index = pool_args([70, 6, 37], 2, k_spec, v_spec)  # the new tokens already stored
    q = torch.randn(3, 6, 2 * ratio, D, generator=gen(8))  # the last 6 tokens of each request
    both(q, *args, **index, block_tokens=16, num_splits=2)


def test_extend_over_rows_and_tail_with_left_padding_and_rotation():
    k_spec, v_spec = QuantSpec(4, rotation="hadamard"), QuantSpec(8, rotation="hadamard")
    args, tails = stored_rows(k_spec, v_spec, 30, 30, 35)
    q = torch.randn(2, 9, 4, D, generator=gen(9))  # 4 queries on packed rows, 5 on the tail
    starts = torch.tensor([3, 28], dtype=torch.int32)  # request 1: its first queries see nothing
    got, _ = both(q, *args, **tails, starts=starts, block_tokens=16)
    assert torch.equal(got[1, :2], torch.zeros_like(got[1, :2]))  # positions 26, 27 < start


@pytest.mark.parametrize("symmetric", [False, True])
def test_channel_axis_keys_with_their_own_tail(symmetric):
    k_spec = QuantSpec(2, group_size=16, axis="channel", symmetric=symmetric)
    args, tails = stored_rows(k_spec, QuantSpec(4), 48, 53, 57)  # KIVI: K 48 + 9, V 53 + 4
    q = torch.randn(2, 4, D, generator=gen(10))
    starts = torch.tensor([0, 20], dtype=torch.int32)
    both(q, *args, **tails, starts=starts, block_tokens=16, num_splits=2)
    qx = torch.randn(2, 7, 4, D, generator=gen(11))  # extend over the same layer
    both(qx, *args, **tails, block_tokens=16)


def test_values_packed_past_keys_and_16bit_keys_all_in_the_tail():
    args, tails = stored_rows(QuantSpec(16), QuantSpec(8), 0, 40, 45)  # K: all in its tail
    q = torch.randn(2, 4, D, generator=gen(12))
    both(q, *args, **tails, block_tokens=16)
    tails["k_tail"] = tails["k_tail"][:, :, 1:]
    with pytest.raises(ValueError, match="same token"):
        decode_attention(q, *args, **tails)


def test_scale_after_dot_takes_token_axis_groups_of_16_or_more():
    """Rows the variant reads: quantized token-axis, groups >= 16 channels, any bit width; the
    rest stays element-wise, and everything with the variant off."""
    for bits in (2, 3, 4, 5, 6, 8):
        assert takes_after_dot(QuantSpec(bits, group_size=16), True)
        assert takes_after_dot(QuantSpec(bits, symmetric=True), True)
        assert not takes_after_dot(QuantSpec(bits), False)
    for spec in (QuantSpec(4, group_size=8), QuantSpec(4, axis="channel"), QuantSpec(16)):
        assert not takes_after_dot(spec, True)


def test_the_keyword_overrides_the_environment(monkeypatch):
    spec = QuantSpec(4)
    args, index = pool_args(RAGGED, 2, spec, spec)
    index["specialized"] = False  # the general kernel's variants (decode_kernel: its own)
    q = torch.randn(3, 8, D, generator=gen(13))
    monkeypatch.setenv(ENV, "1")
    assert wanted(None) and not wanted(False)
    env_on = decode_attention(q, *args, **index, block_tokens=16)
    off = decode_attention(q, *args, **index, block_tokens=16, scale_after_dot=False)
    monkeypatch.delenv(ENV)
    assert not wanted(None) and wanted(True)
    on = decode_attention(q, *args, **index, block_tokens=16, scale_after_dot=True)
    assert torch.equal(on, env_on)
    assert not torch.equal(on, off)  # another order of operations: not bitwise equal, but
    torch.testing.assert_close(on, off, atol=2e-5, rtol=2e-5)  # equal within the tolerance


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(q=torch.randn(3, 3, D)), "multiple"),
        (dict(q=torch.randn(3, 8, 24)), "power of two"),
        (dict(lengths=torch.tensor(RAGGED)), "int32"),
        (dict(k_spec=QuantSpec(8)), "bytes"),
        (dict(k_spec=QuantSpec(4, axis="channel")), "token-axis"),
        (dict(slot_table=None), "B, Hkv, T, R"),
    ],
)
def test_launcher_rejects_bad_arguments_with_one_line(change, match):
    k_rows, v_rows, table, lens = paged_pool(RAGGED, 2, QuantSpec(4), QuantSpec(4))
    args = dict(
        q=torch.randn(3, 8, D),
        k_rows=k_rows,
        v_rows=v_rows,
        k_spec=QuantSpec(4),
        v_spec=QuantSpec(4),
        lengths=lens,
        slot_table=table,
    )
    args.update(change)
    with pytest.raises(ValueError, match=match) as info:
        decode_attention(**args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "k_spec,v_spec",
    [
        (QuantSpec(4, group_size=D), QuantSpec(8, group_size=16)),  # one scale a token-head
        (QuantSpec(8), QuantSpec(4, symmetric=True)),
        (QuantSpec(3), QuantSpec(16)),  # 3-bit chunks; 16-bit values stay rows
    ],
    ids=lambda s: s.short(),
)
@pytest.mark.parametrize("q_tokens", [1, 6])  # decode, extend
@pytest.mark.parametrize("specialized", [True, False])  # their own kernels, the general one
def test_a_pool_of_planes_attends_as_its_rows(k_spec, v_spec, q_tokens, specialized):
    """Each slot's codes of every head, then their scales and zeros (``planes``): the kernels
    find a head's metadata where its offset says (another head's scales, or codes read as
    scales, would not match the rows' reference), and the reference reads planes as rows."""
    k_rows, v_rows, table, lens = paged_pool([70, 6, 37], 4, k_spec, v_spec)
    planes = [to_planes(r, s, D) if plannable(s, D) else r
              for r, s in ((k_rows, k_spec), (v_rows, v_spec))]  # fmt: skip
    assert not torch.equal(planes[0], k_rows)
    q = torch.randn(3, q_tokens, 8, D, generator=gen(12))
    kw = dict(lengths=lens, slot_table=table, block_tokens=16, num_splits=2)
    ref = extend_attention_reference(q, k_rows, v_rows, k_spec, v_spec, **kw)
    got = extend_attention(q, *planes, k_spec, v_spec, planes=True, specialized=specialized, **kw)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    again = extend_attention_reference(q, *planes, k_spec, v_spec, planes=True, **kw)
    torch.testing.assert_close(again, ref, atol=0, rtol=0)


def test_planes_are_a_paged_pools_layout():
    spec = QuantSpec(4, group_size=D)
    args, tails = stored_rows(spec, spec, 10, 10, 12)
    q = torch.randn(2, 4, D, generator=gen(13))
    with pytest.raises(ValueError, match="planes are a paged pool's layout"):
        decode_attention(q, *args, **tails, planes=True)
