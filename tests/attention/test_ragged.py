"""Ragged extend batches (SGLang's qo_indptr): each request its own count of new tokens."""

from __future__ import annotations

import pytest
import torch
from test_decode import D, gen, paged_pool

from kvtuner.attention import extend_attention, extend_attention_reference
from kvtuner.quant import QuantSpec

pytestmark = pytest.mark.usefixtures("attention_variant")  # both kernel variants

LENGTHS = [70, 6, 37, 1, 20]  # stored tokens per request (prefix + new)
NEW = [5, 6, 1, 1, 0]  # new tokens: a whole request, a decode-like one, an empty one


def ragged_q(new, heads, seed):
    indptr = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randn(int(indptr[-1]), heads, D, generator=gen(seed)), indptr


@pytest.mark.parametrize(
    "k_spec,v_spec,ratio",
    [
        (QuantSpec(4), QuantSpec(3, group_size=16, symmetric=True), 1),
        (QuantSpec(2, group_size=16), QuantSpec(8), 4),
        (QuantSpec(8, symmetric=True), QuantSpec(16), 2),
    ],
    ids=lambda x: x.short() if isinstance(x, QuantSpec) else f"gqa{x}",
)
def test_ragged_extend_matches_the_reference(k_spec, v_spec, ratio):
    k_rows, v_rows, table, lens = paged_pool(LENGTHS, 2, k_spec, v_spec, slots=160)
    q, indptr = ragged_q(NEW, 2 * ratio, seed=ratio)
    args = (q, k_rows, v_rows, k_spec, v_spec)
    index = dict(lengths=lens, slot_table=table, qo_indptr=indptr, max_q_len=max(NEW))
    got = extend_attention(*args, **index, block_tokens=16, num_splits=2)
    ref = extend_attention_reference(*args, **index)
    assert got.shape == q.shape
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def test_ragged_extend_reads_smoothed_key_rows():
    """Key rows holding k / λ: the kernel (q·λ) and the reference (rows·λ) agree, and λ moves
    the result (a reference that dropped it would not)."""
    spec = QuantSpec(4)
    k_rows, v_rows, table, lens = paged_pool(LENGTHS, 2, spec, spec, slots=160)
    q, indptr = ragged_q(NEW, 4, seed=11)
    lam = torch.rand(2, D, generator=gen(12)) * 4 + 0.25
    args = (q, k_rows, v_rows, spec, spec)
    index = dict(lengths=lens, slot_table=table, qo_indptr=indptr, max_q_len=max(NEW))
    got = extend_attention(*args, **index, k_smooth=lam, block_tokens=16, num_splits=2)
    ref = extend_attention_reference(*args, **index, k_smooth=lam)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    plain = extend_attention_reference(*args, **index)
    assert not torch.allclose(ref, plain, atol=1e-3)


def test_ragged_rows_equal_each_request_run_alone():
    spec = QuantSpec(4)
    k_rows, v_rows, table, lens = paged_pool(LENGTHS, 2, spec, spec)
    q, indptr = ragged_q(NEW, 4, seed=7)
    rows = torch.tensor([4, 0, 2, 1, 3], dtype=torch.int32)  # req_pool_indices order
    got = extend_attention(
        q, k_rows, v_rows, spec, spec, lengths=lens[rows.long()], slot_table=table,
        table_rows=rows, qo_indptr=indptr, max_q_len=8, block_tokens=16,
    )  # fmt: skip
    for b, n in enumerate(NEW):
        if n == 0:
            continue
        alone = extend_attention(
            q[None, indptr[b] : indptr[b + 1]], k_rows, v_rows, spec, spec,
            lengths=lens[rows[b : b + 1].long()], slot_table=table, table_rows=rows[b : b + 1],
            block_tokens=16,
        )  # fmt: skip
        # a one-token request alone runs the decode kernel, whose keys of one scale a row are
        # dotted in another channel order (fp32 rounding: 1.3e-6 seen)
        torch.testing.assert_close(got[indptr[b] : indptr[b + 1]], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(max_q_len=None), "max_q_len"),
        (dict(qo_indptr=torch.tensor([0, 5, 11, 12, 13], dtype=torch.int64)), "int32"),
        (dict(slot_table=None), "paged"),
        (dict(q=torch.randn(1, 13, 4, D)), r"\[N, Hq, D\]"),
    ],
)
def test_ragged_arguments_are_checked_with_one_line(change, match):
    spec = QuantSpec(4)
    k_rows, v_rows, table, lens = paged_pool(LENGTHS, 2, spec, spec)
    q, indptr = ragged_q(NEW, 4, seed=0)
    args = dict(q=q, k_rows=k_rows, v_rows=v_rows, k_spec=spec, v_spec=spec, lengths=lens,
                slot_table=table, qo_indptr=indptr, max_q_len=6)  # fmt: skip
    args.update(change)
    with pytest.raises(ValueError, match=match) as info:
        extend_attention(**args)
    assert "\n" not in str(info.value)
