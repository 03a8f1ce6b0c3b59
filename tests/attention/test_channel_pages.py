"""Channel-axis (KIVI) keys in a paged pool: one block per full page of G slots, the filling
pages' fp values staged (the SGLang pool's ChannelPages), read by the fused kernels under
TRITON_INTERPRET against the reference (decode and extend: the decode and extend kernels, a
page a tile; windows: the general kernel), and the reference against SDPA over what the page
store itself reads back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_decode import D, gen
from test_ragged import ragged_q

from kvtuner.attention import (
    AttentionBatch,
    decode_attention,
    decode_attention_reference,
    extend_attention,
    extend_attention_reference,
)
from kvtuner.attention.decode_kernel import plan_decode, serves
from kvtuner.attention.extend_kernel import serves_extend
from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.runtime_loader.sglang.pool.channel_pages import ChannelPages
from kvtuner.runtime_loader.sglang.pool.geometry import PoolGeometry

pytestmark = pytest.mark.usefixtures("attention_variant")  # both kernel variants

G, HEADS, PAGES = 16, 2, 12
LENGTHS = [40, 9, 23, 33]  # full and filling pages; request 1 has only a filling page
PAGE_OF = [[3, 7, 1], [5], [9, 0], [2, 11, 4]]  # each request's pages, in order


def pool(k_spec, v_spec, seed=0, page=G):
    """(key pages, V rows [slots, Hkv, R], slot table): each request written in two chunks,
    in pages of ``page`` slots (``k_spec``'s group)."""
    g = gen(seed)
    geometry = PoolGeometry(PAGES * page, page, HEADS, D, torch.float32, "cpu", stage_pages=8)
    keys = ChannelPages(k_spec, geometry)
    slots = PAGES * page
    v_rows = quantize(torch.randn(slots, HEADS, D, generator=g), v_spec)
    table = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.int32)
    for b, (n, pages) in enumerate(zip(LENGTHS, PAGE_OF, strict=True)):
        loc = torch.cat([torch.arange(p * page, p * page + page) for p in pages])[:n]
        table[b, :n] = loc.int()
        k = torch.randn(n, HEADS, D, generator=g) * 2
        cut = n // 2  # a page filled across two writes is packed on the second
        keys.write(loc[:cut], k[:cut])
        keys.write(loc[cut:], k[cut:])
    return keys, v_rows, table


def args(keys, v_rows, table, k_spec, v_spec):
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    index = dict(lengths=lens, slot_table=table, k_stage=keys.stage, k_stage_rows=keys.stage_rows)
    return (keys.blocks, v_rows, k_spec, v_spec), index


PAGE_SPECS = [  # KIVI keys with token-axis values; symmetric 2-bit keys; 3-bit codes (2 planes)
    (QuantSpec(4, group_size=G, axis="channel"), QuantSpec(4)),
    (QuantSpec(2, group_size=G, axis="channel", symmetric=True), QuantSpec(8, group_size=16)),
    (QuantSpec(3, group_size=G, axis="channel", symmetric=True), QuantSpec(8, group_size=16)),
]


@pytest.mark.parametrize("k_spec,v_spec", PAGE_SPECS, ids=lambda s: s.short())
def test_decode_reads_full_and_filling_pages(k_spec, v_spec):
    keys, v_rows, table = pool(k_spec, v_spec)
    assert keys.staged_pages > 0 and (keys.stage_rows >= 0).sum() == keys.staged_pages
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q = torch.randn(4, 8, D, generator=gen(1))
    got = decode_attention(q, *rows, **index, block_tokens=16, num_splits=2)
    ref = decode_attention_reference(q, *rows, **index)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    for b, n in enumerate(LENGTHS):  # the reference is SDPA over what the store reads back
        loc = table[b, :n]
        k = keys.read(loc).transpose(0, 1)
        v = dequantize(v_rows[loc.long()], v_spec, D, torch.float32).transpose(0, 1)
        want = F.scaled_dot_product_attention(q[b, :, None], k, v, enable_gqa=True)[:, 0]
        torch.testing.assert_close(ref[b], want, atol=2e-5, rtol=2e-5)


def test_ragged_extend_with_a_window():
    k_spec, v_spec = QuantSpec(4, group_size=G, axis="channel"), QuantSpec(3, symmetric=True)
    keys, v_rows, table = pool(k_spec, v_spec, seed=2)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q, indptr = ragged_q([5, 9, 1, 0], 4, seed=3)
    index.update(qo_indptr=indptr, max_q_len=9, window=12)
    got = extend_attention(q, *rows, **index, block_tokens=16, num_splits=2)
    ref = extend_attention_reference(q, *rows, **index)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def extend_batch(q, rows, index) -> AttentionBatch:
    return AttentionBatch(q=q, k_rows=rows[0], v_rows=rows[1], k_spec=rows[2], v_spec=rows[3],
                          **index)  # fmt: skip


@pytest.mark.parametrize("k_spec,v_spec", PAGE_SPECS, ids=lambda s: s.short())
def test_the_extend_kernel_reads_full_pages_and_the_filling_page(k_spec, v_spec):
    """SGLang's ragged extend over KIVI pages on the extend kernel (no window): new tokens
    inside the filling page, across pages, a whole request new, none; requests ending on a
    page's end (the second lengths)."""
    keys, v_rows, table = pool(k_spec, v_spec, seed=7)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q, indptr = ragged_q([5, 9, 12, 0], 4, seed=8)
    index.update(qo_indptr=indptr, max_q_len=12)
    assert serves_extend(extend_batch(q, rows, index))
    for lengths in (LENGTHS, [32, 9, 16, 33]):
        index["lengths"] = torch.tensor(lengths, dtype=torch.int32)
        ref = extend_attention_reference(q, *rows, **index)
        for launch in (dict(block_tokens=16, num_splits=3), {}):
            got = extend_attention(q, *rows, **index, **launch)
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("attention_variant", ["baseline"], indirect=True)
def test_the_extend_kernel_attends_new_tokens_in_hand_over_pages(attention_variant):
    """The prefix from the pages (packed or staged, as the pool holds it), the new tokens from
    the values in hand, exact; a window leaves the batch to the general kernel (which reads
    them from the pool: the baseline variant only)."""
    k_spec, v_spec = QuantSpec(4, group_size=G, axis="channel"), QuantSpec(4)
    keys, v_rows, table = pool(k_spec, v_spec, seed=9)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    new = [5, 9, 20, 0]
    q, indptr = ragged_q(new, 4, seed=10)
    g = gen(11)
    hand = dict(k_new=torch.randn(sum(new), HEADS, D, generator=g) * 3,
                v_new=torch.randn(sum(new), HEADS, D, generator=g))  # fmt: skip
    index.update(qo_indptr=indptr, max_q_len=20)
    got = extend_attention(q, *rows, **index, **hand, block_tokens=16, num_splits=3)
    ref = extend_attention_reference(q, *rows, **index, **hand)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    rows_only = extend_attention_reference(q, *rows, **index)
    assert not torch.allclose(got, rows_only, atol=1e-2)  # the values in hand were read
    assert not serves_extend(extend_batch(q, rows, dict(index, window=12)))


def test_stage_arguments_are_checked_with_one_line():
    k_spec, v_spec = QuantSpec(4, group_size=G, axis="channel"), QuantSpec(4)
    keys, v_rows, table = pool(k_spec, v_spec)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q = torch.randn(4, 8, D)
    for change, match in (
        (dict(k_stage=None), "come together"),
        (dict(k_stage_rows=keys.stage_rows.long()), "int32"),
        (dict(k_stage=keys.stage[:, :8]), r"\[rows, G, Hkv, D\]"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            decode_attention(q, *rows, **{**index, **change})
        assert "\n" not in str(info.value)


def batch_of(q, rows, index, **change) -> AttentionBatch:
    return AttentionBatch(q=q.unsqueeze(1), k_rows=rows[0], v_rows=rows[1], k_spec=rows[2],
                          v_spec=rows[3], **{**index, **change})  # fmt: skip


@pytest.mark.parametrize(
    "k_spec,v_spec",
    [
        (QuantSpec(3, group_size=G, axis="channel"), QuantSpec(4)),  # codes in two planes
        (QuantSpec(8, group_size=G, axis="channel", symmetric=True), QuantSpec(2, group_size=16)),
    ],
    ids=lambda s: s.short(),
)
@pytest.mark.parametrize("ratio", [1, 4])
def test_the_decode_kernel_reads_a_page_a_tile(k_spec, v_spec, ratio):
    """Full pages' blocks and the filling page's staged values; requests that end inside a
    page and on a page's end (the second lengths: no filling page attended). The plan: one
    warp, 3-bit pages too (56 B spilled there before keys were dotted first)."""
    keys, v_rows, table = pool(k_spec, v_spec, seed=4)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q = torch.randn(len(LENGTHS), HEADS * ratio, D, generator=gen(5))
    assert serves(batch_of(q, rows, index))
    assert plan_decode(batch_of(q, rows, index)).num_warps == 1
    for lengths in (LENGTHS, [32, 9, 16, 33]):
        index["lengths"] = torch.tensor(lengths, dtype=torch.int32)
        got = decode_attention(q, *rows, **index, block_tokens=16, num_splits=2)
        ref = decode_attention_reference(q, *rows, **index)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
        for launch in ({}, dict(block_tokens=64)):  # the plan's tiles; a page's at most
            got = decode_attention(q, *rows, **index, **launch)
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def test_what_the_decode_kernel_leaves_to_the_general_one_with_pages():
    """A window (tiles start at pages), pre-RoPE keys of rotary halves under a dot's 16
    channels, pages under a 16-token tile."""
    k_spec, v_spec = QuantSpec(4, group_size=G, axis="channel"), QuantSpec(4)
    keys, v_rows, table = pool(k_spec, v_spec)
    rows, index = args(keys, v_rows, table, k_spec, v_spec)
    q = torch.randn(len(LENGTHS), HEADS, D, generator=gen(6))
    assert not serves(batch_of(q, rows, index, window=12))
    assert serves(batch_of(q, rows, index, rope_freq=torch.ones(D // 2)))  # R = 32: spans
    assert not serves(batch_of(q, rows, index, rope_freq=torch.ones(4)))  # R = 8
    small = QuantSpec(4, group_size=8, axis="channel")
    stage = torch.zeros(8, 8, HEADS, D)
    pages = torch.zeros(PAGES * 2, HEADS, small.block_bytes(D), dtype=torch.uint8)
    rows8 = (pages, v_rows, small, v_spec)
    stage_rows = torch.full((PAGES * 2,), -1, dtype=torch.int32)
    assert not serves(batch_of(q, rows8, {**index, "k_stage": stage, "k_stage_rows": stage_rows}))
