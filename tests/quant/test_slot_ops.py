"""Pool-facing ops on CPU tensors (the torch reference path): slots and argument checks."""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import (
    QuantSpec,
    dequantize,
    gather_dequantized,
    quantize,
    quantize_rows,
    scatter_kv,
    scatter_quantized,
)


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(2, 32),
        QuantSpec(8, 16, True),
        QuantSpec(16),
        QuantSpec(3, 8),
        QuantSpec(5, 32, True),
    ],
)
def test_scatter_touches_only_given_slots(spec):
    buf = torch.randint(0, 256, (9, 2, spec.row_bytes(64)), dtype=torch.uint8)
    before = buf.clone()
    loc = torch.tensor([5, 0, 8], dtype=torch.int32)
    x = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    scatter_quantized(buf, loc, x, spec)
    assert torch.equal(buf[loc.long()], quantize(x, spec))
    untouched = torch.ones(9, dtype=torch.bool)
    untouched[loc.long()] = False
    assert torch.equal(buf[untouched], before[untouched])
    out = gather_dequantized(buf, loc, spec, 64, torch.bfloat16)
    assert torch.equal(out, dequantize(quantize(x, spec), spec, 64, torch.bfloat16))


def test_scatter_kv_writes_each_side_as_scatter_quantized():
    """K and V of one write, each side its spec (8-bit g64 keys, 4-bit values), same slots."""
    k_spec, v_spec = QuantSpec(8, 64), QuantSpec(4, 32)
    loc = torch.tensor([5, 0, 8], dtype=torch.int32)
    k, v = torch.randn(2, 3, 2, 64, dtype=torch.bfloat16)
    got = [torch.zeros(9, 2, s.row_bytes(64), dtype=torch.uint8) for s in (k_spec, v_spec)]
    want = [rows.clone() for rows in got]
    scatter_kv(*got, loc, k, v, k_spec, v_spec)
    scatter_quantized(want[0], loc, k, k_spec)
    scatter_quantized(want[1], loc, v, v_spec)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[1].any()


def test_planes_on_the_reference_path_hold_the_rows_bytes_moved():
    spec = QuantSpec(4, 64)
    buf = torch.randint(0, 256, (6, 2, spec.row_bytes(64)), dtype=torch.uint8)
    before = buf.clone()
    loc, x = torch.tensor([4, 1]), torch.randn(2, 2, 64)
    scatter_quantized(buf, loc, x, spec, planes=True)
    rows = quantize(x, spec)  # [2, 2, 36]: 32 code bytes, a scale and a zero each
    assert torch.equal(buf[loc].flatten(1), torch.cat([rows[:, :, :32].flatten(1),
                                                       rows[:, :, 32:].flatten(1)], 1))  # fmt: skip
    assert torch.equal(buf[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    out = gather_dequantized(buf, loc, spec, 64, planes=True)
    assert torch.equal(out, dequantize(rows, spec, 64))


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(4), QuantSpec(3, 16, True), QuantSpec(16), QuantSpec(8, rotation="hadamard")],
    ids=QuantSpec.short,
)
def test_quantize_rows_with_the_kernel_gives_the_reference_bytes(spec):
    x = torch.randn(2, 3, 33, 64, dtype=torch.bfloat16)[:, :, 1:]  # a strided view, as a tail
    assert torch.equal(quantize_rows(x, spec, kernel=True), quantize(x, spec))
    channel = QuantSpec(4, axis="channel")  # blocks of tokens: always the reference
    assert torch.equal(quantize_rows(x, channel, kernel=True), quantize(x, channel))


def _args(**change):
    args = dict(
        buffer=torch.zeros(4, 2, 40, dtype=torch.uint8),
        loc=torch.tensor([1, 3]),
        x=torch.zeros(2, 2, 64),
        spec=QuantSpec(4, 32),
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(spec=QuantSpec(4, 32, axis="channel")), "token-axis"),
        (dict(buffer=torch.zeros(4, 2, 40)), "buffer must be uint8"),
        (dict(buffer=torch.zeros(4, 80, dtype=torch.uint8)), "buffer must be uint8"),
        (dict(buffer=torch.zeros(4, 2, 36, dtype=torch.uint8)), "spec expects 40"),
        (dict(loc=torch.tensor([[1, 3]])), "loc must be 1-D"),
        (dict(loc=torch.tensor([1.0, 3.0])), "loc must be 1-D"),
        (dict(x=torch.zeros(3, 2, 64)), "x must be"),
        (dict(x=torch.zeros(2, 3, 64)), "x must be"),
        (dict(x=torch.zeros(2, 64)), "x must be"),
    ],
)
def test_scatter_argument_checks(change, message):
    a = _args(**change)
    with pytest.raises(ValueError, match=message):
        scatter_quantized(a["buffer"], a["loc"], a["x"], a["spec"])


@pytest.mark.parametrize(
    ("change", "head_dim", "message"),
    [
        (dict(buffer=torch.zeros(4, 2, 40, dtype=torch.int16)), 64, "buffer must be uint8"),
        (dict(), 96, "spec expects 60"),
        (dict(loc=torch.tensor([1], dtype=torch.int16)), 64, "loc must be 1-D"),
    ],
)
def test_gather_argument_checks(change, head_dim, message):
    a = _args(**change)
    with pytest.raises(ValueError, match=message):
        gather_dequantized(a["buffer"], a["loc"], a["spec"], head_dim)
