"""Planes: a slot's codes of every head, then their scales and zeros (the torch side)."""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import QuantSpec, quantize
from kvtuner.quant.planes import from_planes, meta_bytes, planes_align, plannable, to_planes


def test_a_heads_codes_and_metadata_land_where_the_layout_says():
    spec, heads, dim = QuantSpec(4, 128), 8, 128
    rows = quantize(torch.randn(3, heads, dim), spec)  # [3, 8, 68]: 64 code bytes, 4 of metadata
    planes = to_planes(rows, spec, dim)
    assert planes.shape == rows.shape
    slot = planes[1].flatten()
    for h in range(heads):
        assert torch.equal(slot[64 * h : 64 * (h + 1)], rows[1, h, :64])
        assert torch.equal(slot[8 * 64 + 4 * h : 8 * 64 + 4 * (h + 1)], rows[1, h, 64:])
    assert torch.equal(from_planes(planes, spec, dim), rows)


@pytest.mark.parametrize(
    "spec,heads,aligns",
    [
        (QuantSpec(4, 128), 8, True),  # 68-byte rows: codes 64 apart, 544-byte slots
        (QuantSpec(8, 64), 8, True),  # 136
        (QuantSpec(8, 64), 2, True),  # 272-byte slots
        (QuantSpec(4, 128), 2, False),  # 136-byte slots: no layout aligns them
        (QuantSpec(4, 128), 1, False),
        (QuantSpec(4, 32), 8, False),  # 80-byte rows are aligned as they are
        (QuantSpec(16), 8, False),  # no metadata
    ],
    ids=str,
)
def test_planes_align_codes_only_where_rows_do_not(spec, heads, aligns):
    assert planes_align(spec, 128, heads) is aligns


def test_what_cannot_be_laid_out_as_planes_says_so():
    sym_row = QuantSpec(4, 128, symmetric=True)  # one 2-byte scale: no whole word
    assert meta_bytes(sym_row, 128) == 2 and not plannable(sym_row, 128)
    assert not plannable(QuantSpec(4, axis="channel"), 128)
    rows = quantize(torch.randn(2, 2, 128), sym_row)
    with pytest.raises(ValueError, match="not laid out as planes"):
        to_planes(rows, sym_row, 128)
