"""Sliding windows, logit soft caps (Gemma 2/3) and attention sinks (GPT-OSS) in the fused
kernel: against the torch reference, and the reference against plain formulas over the
dequantized tensors (SDPA with a window mask; the soft cap and sinks written out)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_decode import D, both, gen, paged_pool, pool_args, stored_rows
from test_ragged import ragged_q

from kvtuner.attention import (
    AttentionBatch,
    decode_attention,
    extend_attention,
    extend_attention_reference,
)
from kvtuner.attention.reference import request_kv
from kvtuner.quant import QuantSpec

pytestmark = pytest.mark.usefixtures("attention_variant")  # both kernel variants

LENGTHS = [70, 1, 37, 20]  # several tiles and splits, a length-1 request
SPECS = (QuantSpec(4), QuantSpec(3, group_size=16, symmetric=True))
GEMMA = dict(window=20, logit_cap=1.5)  # a cap small enough to bend the scores


def sinks(heads: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(heads, generator=gen(seed)) * 2


@pytest.mark.parametrize(
    "extra",
    [dict(window=20), dict(window=1), dict(window=500), dict(logit_cap=1.5), GEMMA],
    ids=["window20", "window1", "window-wider-than-all", "cap", "window+cap"],
)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_on_a_paged_pool(extra, splits):
    args, index = pool_args(LENGTHS, 2, *SPECS)
    q = torch.randn(4, 8, D, generator=gen(1)) * 3
    both(q, *args, **index, **extra, block_tokens=16, num_splits=splits)


@pytest.mark.parametrize("extra", [dict(window=9), GEMMA], ids=["window9", "window+cap"])
def test_extend_on_a_paged_pool(extra):
    args, index = pool_args([70, 12, 37], 2, *SPECS)
    q = torch.randn(3, 12, 4, D, generator=gen(2)) * 3  # the last 12 tokens of each request
    both(q, *args, **index, **extra, block_tokens=16, num_splits=3)


@pytest.mark.parametrize("extra", [dict(window=7), dict(sinks=True), dict(window=7, sinks=True)])
def test_ragged_extend(extra):
    """SGLang's extend batch: one request new, one decode-like, one with no new token."""
    k_rows, v_rows, table, lens = paged_pool([70, 6, 37, 20], 2, *SPECS)
    q, indptr = ragged_q([5, 6, 1, 0], 8, seed=4)
    extra = dict(extra)  # the parametrized dict is shared by every variant
    if extra.pop("sinks", False):
        extra["sinks"] = sinks(8)
    index = dict(lengths=lens, slot_table=table, qo_indptr=indptr, max_q_len=6, **extra)
    args = (q, k_rows, v_rows, *SPECS)
    got = extend_attention(*args, **index, block_tokens=16, num_splits=2)
    torch.testing.assert_close(got, extend_attention_reference(*args, **index), atol=2e-5,
                               rtol=2e-5)  # fmt: skip


def test_contiguous_rows_with_a_tail_left_padding_and_rotation():
    k_spec, v_spec = QuantSpec(4, rotation="hadamard"), QuantSpec(8, rotation="hadamard")
    args, tails = stored_rows(k_spec, v_spec, 30, 30, 41)
    starts = torch.tensor([3, 28], dtype=torch.int32)
    q = torch.randn(2, 9, 4, D, generator=gen(5)) * 3  # 9 queries across rows and tail
    both(q, *args, **tails, starts=starts, window=6, logit_cap=2.0, block_tokens=16)
    both(q[:, -1], *args, **tails, starts=starts, window=13, sinks=sinks(4), num_splits=2,
         block_tokens=16)  # fmt: skip


@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_in_decode_with_a_window(splits):
    args, index = pool_args(LENGTHS, 2, *SPECS)
    q = torch.randn(4, 8, D, generator=gen(6))
    both(q, *args, **index, sinks=sinks(8), window=30, block_tokens=16, num_splits=splits)


def test_bf16_queries_and_sinks_with_a_cap():
    args, index = pool_args(LENGTHS, 2, *SPECS)
    q = (torch.randn(4, 8, D, generator=gen(7)) * 3).bfloat16()
    both(q, *args, **index, sinks=sinks(8).bfloat16(), logit_cap=2.0, tol=3e-2)


def test_window_reference_is_sdpa_over_the_dequantized_window():
    """Each decode query against plain SDPA over its request's last ``window`` dequantized
    tokens (no mask): the window is (p - window, p], the query's own token included."""
    args, index = pool_args(LENGTHS, 2, *SPECS)
    q = torch.randn(4, 8, D, generator=gen(8))
    got = decode_attention(q, *args, **index, window=20, block_tokens=16, num_splits=3)
    batch = AttentionBatch(q.unsqueeze(1), *args, **index)
    for b in range(4):
        k, v = request_kv(batch, b)
        k, v = k[:, -20:], v[:, -20:]
        want = F.scaled_dot_product_attention(q[b, :, None], k, v, enable_gqa=True)[:, 0]
        torch.testing.assert_close(got[b], want, atol=2e-5, rtol=2e-5)


def test_cap_and_sinks_reference_is_the_written_out_softmax():
    """The reference's soft cap and sinks against one query's scores computed by hand."""
    args, index = pool_args([33], 1, *SPECS)
    q, cap, sink = torch.randn(1, 2, D, generator=gen(9)) * 4, 1.5, sinks(2)
    got = decode_attention(q, *args, **index, logit_cap=cap, sinks=sink, block_tokens=16)
    k, v = request_kv(AttentionBatch(q.unsqueeze(1), *args, **index), 0)  # [1, 33, D]
    for h in range(2):
        s = cap * torch.tanh(k[0] @ q[0, h] * D**-0.5 / cap)  # [33]
        p = torch.exp(s) / (torch.exp(s).sum() + torch.exp(sink[h]))
        torch.testing.assert_close(got[0, h], p @ v[0], atol=2e-5, rtol=2e-5)


def test_window_skips_the_tiles_before_it_without_changing_the_result():
    """A request whose early slots hold NaN rows: a window that excludes them reads none."""
    spec = QuantSpec(4)
    k_rows, v_rows, table, lens = paged_pool([70], 1, spec, spec)
    k_rows[table[0, :32].long()] = 0xFF  # NaN scales on every token below position 32
    v_rows[table[0, :32].long()] = 0xFF
    q = torch.randn(1, 2, D, generator=gen(10))
    got = decode_attention(q, k_rows, v_rows, spec, spec, lengths=lens, slot_table=table,
                           window=38, block_tokens=16, num_splits=2)  # fmt: skip
    assert not got.isnan().any()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(window=0), "window"),
        (dict(window=True), "window"),
        (dict(logit_cap=0.0), "logit_cap"),
        (dict(logit_cap=float("inf")), "logit_cap"),
        (dict(sinks=torch.zeros(4)), r"sinks must be float \[Hq\]"),
        (dict(sinks=torch.zeros(8, dtype=torch.int32)), "sinks"),
    ],
)
def test_bad_window_cap_or_sinks_are_rejected_with_one_line(change, match):
    args, index = pool_args(LENGTHS, 2, *SPECS)
    with pytest.raises(ValueError, match=match) as info:
        decode_attention(torch.randn(4, 8, D), *args, **index, **change)
    assert "\n" not in str(info.value)
