"""The merge of split partials: stored in a model dtype, it is the fp32 merge rounded once (what
an eager step got before from a separate cast), with and without sinks."""

from __future__ import annotations

import pytest
import torch

from kvtuner.attention.splits import merge_splits


@pytest.mark.parametrize("with_sinks", [False, True])
def test_merge_in_fp16_is_the_fp32_merge_rounded(with_sinks):
    gen = torch.Generator().manual_seed(5)
    partial = torch.randn(3, 4, 5, 64, generator=gen) * 4  # [rows, Hq, splits, D]
    lse = torch.randn(3, 4, 5, generator=gen) * 3
    lse[0, 0, 1:] = -float("inf")  # splits that saw nothing
    sinks = torch.randn(4, generator=gen) if with_sinks else None
    merged = merge_splits(partial, lse, sinks)
    half = merge_splits(partial, lse, sinks, torch.float16)
    assert merged.dtype == torch.float32 and half.dtype == torch.float16
    torch.testing.assert_close(half, merged.to(torch.float16), rtol=0, atol=0)
    if not with_sinks:  # one split saw anything: the merge is that split's partial
        torch.testing.assert_close(merged[0, 0], partial[0, 0, 0])
