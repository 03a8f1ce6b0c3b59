"""Golden bytes: the packed format (v1, and v3's 3/5/6-bit codes) written out literally, so it
cannot change silently.

If one of these fails, the on-disk / in-pool format changed: that breaks every profile-serving
runtime holding packed KV, so bump the format version instead of editing the bytes.
"""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import QuantSpec, dequantize, quantize

# Two token-heads, head_dim 16. Row 1's first 8 values are a constant group; it also holds -0.0.
X = torch.tensor(
    [
        [-1.5, -0.75, 0.0, 0.3, 0.9, 1.2, 2.0, 2.5, -3.1, 0.01, 0.7, -0.2, 1.9, 4.4, -2.2, 0.55],
        [0.125] * 8 + [10.0, -7.5, 3.3, 0.0, -0.0, 6.1, -9.9, 2.2],
    ]
)

GOLDEN = {
    # codes (4 per byte) | 2 fp16 scales | 2 fp16 zeros
    "2b_asym_g8": (
        QuantSpec(2, 8),
        ["54fa644e563d014100be34c2", "000063890000a3460030f4c8"],
    ),
    # codes (2 per byte) | 2 fp16 absmax scales
    "4b_sym_g8": (
        QuantSpec(4, 8, symmetric=True),
        ["5387aaed7278ea8400416744", "eeeeeeee2e79b79000300049"],
    ),
    # 16 codes | 1 scale | 1 zero
    "8b_asym_g16": (
        QuantSpec(8, 16),
        [
            "365069748892adbe006a8163aaff1f7c882734c2",
            "8181818181818181ff1fa97f7fcd009bff2cf4c8",
        ],
    ),
    # one block of 2 tokens: 2 code rows of 8 bytes | 16 scales | 16 zeros
    "4b_asym_channel_g2": (
        QuantSpec(4, 2, axis="channel"),
        [
            "00f0fffff0000f0fff0f00000ffff0f0"
            "ef2e782b4520fa219e2a972c00301231fd3a02388d31d5220e30432f1d380b2f"
            "00be00ba00000030003000300030003034c280c7993967b200006644f4c86638"
        ],
    ),
    # v3: 3/5/6-bit codes as a low plane (their low 2/4/4 bits, 4/2/2 a byte) and a high plane
    # (the other 1/1/2 bits). Row 0's codes are 0,1,3,3,4,5,6,7,0,3,4,3,5,7,1,3: low bits
    # 0,1,3,3 -> byte f4; high bits 0,0,0,0,1,1,1,1 -> byte f0 (16 codes: no whole 32-code
    # high word, so channel order; tests/quant/test_reference.py has the order of whole words)
    "3b_asym_g8": (
        QuantSpec(3, 8),
        ["f4e4ccddf03493384a3c00be34c2", "0000d70b00a50000b0410030f4c8"],
    ),
    # 8 low-plane bytes | 2 high-plane bytes | 1 fp16 absmax scale
    "5b_sym_g16": (
        QuantSpec(5, 16, symmetric=True),
        ["ca0f3286f4e1e518f8b46744", "ffffffff4ef48f2000a50049"],
    ),
    # 8 low-plane bytes | 4 high-plane bytes (one whole 16-code word: pairs' bits 16 apart) |
    # 2 scales | 2 zeros
    "6b_asym_g8": (
        QuantSpec(6, 8),
        ["c0c8a6f7a080faf84059ea73112c9f2f00be34c2", "000000008ffa3f600c48c48000000f350030f4c8"],
    ),
    # rotated by the 16x16 Hadamard matrix first: 8 code bytes | scale | zero
    "4b_asym_g16_hadamard": (
        QuantSpec(4, 16, rotation="hadamard"),
        ["4c78a062cab478bf4037e6c3", "88baf9957745066a343de0c8"],
    ),
}


def _hex_rows(rows: torch.Tensor) -> list[str]:
    return [bytes(r.tolist()).hex() for r in rows.reshape(-1, rows.shape[-1])]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_bytes(name):
    spec, expected = GOLDEN[name]
    assert _hex_rows(quantize(X, spec)) == expected


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_bytes_decode_close_to_input(name):
    spec, expected = GOLDEN[name]
    rows = torch.tensor([list(bytes.fromhex(h)) for h in expected], dtype=torch.uint8)
    if spec.axis == "channel":
        rows = rows.reshape(1, -1)
    out = dequantize(rows, spec, 16)
    step = (X.amax() - X.amin()) / (2**spec.bits - 1)
    assert out.shape == X.shape
    assert (out - X).abs().max() <= step  # loose: the exact bound is tested in test_reference


def test_golden_constant_group_and_signed_zero():
    # row 1, group 0 (8 x 0.125): zero = 0.125 (0x3000), scale = +0 -> decodes exactly
    rows = quantize(X, QuantSpec(2, 8))
    assert _hex_rows(rows)[1][8:16] == "0000a346"  # scales: +0.0, then group 1
    assert torch.equal(dequantize(rows, QuantSpec(2, 8), 16)[1, :8], X[1, :8])


def test_golden_poisoned_group():
    y = X.clone()
    y[0, 9] = float("nan")
    y[1, 3] = float("-inf")
    assert _hex_rows(quantize(y, QuantSpec(4, 8))) == [
        "3076a9fd000000004534007e00be007e",
        "000000002f7ac790007e4f3d007ef4c8",
    ]
