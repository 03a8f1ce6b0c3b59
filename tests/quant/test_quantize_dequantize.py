"""quantize_dequantize: the rows of quantize and the values of dequantize(rows), in one pass
(the SGLang pool's write of a new token uses it to skip unpacking what it just packed)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from test_reference import SPECS, _finite_rows

from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.quant.reference import quantize_dequantize

ROTATED = [QuantSpec(4, rotation="hadamard"), QuantSpec(3, 8, True, rotation="hadamard")]


def _same(spec: QuantSpec, x: torch.Tensor, dtype: torch.dtype) -> None:
    rows, values = quantize_dequantize(x, spec, dtype)
    ref_rows = quantize(x, spec)
    ref = dequantize(ref_rows, spec, x.shape[-1], dtype)
    assert torch.equal(rows, ref_rows)
    assert values.dtype == dtype and values.shape == ref.shape
    finite = ~ref.isnan()  # poisoned groups: NaN in both (the payload may differ)
    assert torch.equal(values.isnan(), ~finite)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(values[finite].view(bits), ref[finite].view(bits))  # bit for bit


@pytest.mark.parametrize("spec", SPECS + ROTATED, ids=QuantSpec.short)
@settings(max_examples=25, deadline=None)
@given(data=_finite_rows(64))
def test_rows_and_values_equal_quantize_then_dequantize(spec, data):
    x = torch.from_numpy(data)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        _same(spec, x, dtype)


@pytest.mark.parametrize("spec", [*SPECS[::4], *ROTATED, QuantSpec(16)], ids=QuantSpec.short)
def test_non_finite_constant_and_signed_zero_groups(spec):
    torch.manual_seed(1)
    x = torch.randn(6, 3, 64) * 5
    x[0, 1, 3], x[1, 0, 40], x[2, 2, 9] = float("nan"), float("inf"), -7e4
    x[3] = 2.5  # constant groups
    x[4, :, ::2] = -0.0
    x[4, :, 1::2] = 0.0
    for dtype in (torch.float32, torch.float16):
        _same(spec, x.to(dtype), dtype)
