"""KeySmoothing: validation, the format (quantize(x / λ), read × λ), golden bytes."""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.quant.smoothing import KeySmoothing, smooth, unsmooth


def test_factors_must_be_finite_positive_fp16_numbers():
    KeySmoothing(((1.0, 0.5), (2.0, 0.25)))
    for bad in (((1.0, 0.0),), ((1.0, -1.0),), ((1.0, float("inf")),), ((1.0, float("nan")),),
                ((1.0, 0.1),), ((1.0, True),), ((1.0, 2.0), (1.0,)), ()):  # fmt: skip
        with pytest.raises(ValueError):
            KeySmoothing(bad)


def test_check_shape_names_both_shapes():
    lam = KeySmoothing(((1.0,) * 8,) * 2)
    lam.check_shape(2, 8)
    with pytest.raises(ValueError, match=r"\[2, 8\].*\[3, 8\]"):
        lam.check_shape(3, 8)


def test_from_magnitudes_is_fp16_with_geometric_mean_one_per_head():
    mags = torch.rand(3, 64) * 10 + 0.01
    lam = KeySmoothing.from_magnitudes(mags, 0.5).tensor()
    assert torch.equal(lam, lam.half().float())
    assert torch.allclose(lam.log().mean(-1), torch.zeros(3), atol=2e-3)
    # larger channels get larger λ: α > 0 keeps the order
    order = mags.argsort(-1)
    assert bool((lam.gather(-1, order).diff(dim=-1) >= 0).all())


def test_smooth_unsmooth_round_trip_and_head_axis():
    lam = KeySmoothing.from_magnitudes(torch.rand(2, 16) + 0.5, 1.0).tensor()
    x = torch.randn(3, 2, 5, 16)  # [B, H, T, D]
    s = smooth(x, lam, -3)
    assert torch.allclose(s * lam[:, None, :], x)
    assert torch.allclose(unsmooth(s, lam, -3, torch.float32), x)
    rows = torch.randn(5, 2, 16)  # [N, H, D]
    assert torch.allclose(smooth(rows, lam, -2) * lam, rows)
    assert smooth(x, None, -3) is x


def test_smoothing_lowers_per_token_error_on_outlier_channels():
    torch.manual_seed(0)
    scale = torch.ones(64)
    scale[[3, 40]] = 30.0  # two outlier channels, as real keys have
    x = torch.randn(512, 2, 64) * scale
    spec = QuantSpec(4, 32)
    lam = KeySmoothing.from_magnitudes(x.abs().amax(0), 0.5).tensor()
    plain = dequantize(quantize(x, spec), spec, 64)
    smoothed = dequantize(quantize(smooth(x, lam, -2), spec), spec, 64) * lam
    assert (smoothed - x).pow(2).mean() < 0.5 * (plain - x).pow(2).mean()


def test_golden_bytes_of_a_smoothed_row():
    """The stored bytes are quantize(fp32(x) / λ): if these change, the v3 format changed."""
    x = torch.linspace(-3, 5, 2 * 32).reshape(1, 2, 32)
    lam = KeySmoothing(tuple(tuple(0.5 + 0.125 * ((h + c) % 8) for c in range(32))
                             for h in range(2)))  # fmt: skip
    rows = quantize(smooth(x, lam.tensor(), -2), QuantSpec(4, 16))
    # per row: 32 codes (2 per byte) | 2 fp16 scales | 2 fp16 zeros
    assert [r.numpy().tobytes().hex() for r in rows[0]] == [
        "4097badc96cbedfe307698badcedfeff8d35963100c6bfbf",
        "11010080574433f2341201b0684523f2eb34ad374f3d9c41",
    ]
