"""The Triton kernels compiled for a real GPU: bytes equal to the CPU reference (the format's
definition), NaN stored as 0x7E00, and one kernel launch per call at decode sizes.

Marked ``cuda``: skipped (with the reason) where torch sees no GPU; run ``pytest -m cuda``."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import cuda_kernel_launches

from kvtuner.quant import (
    QuantSpec,
    dequantize,
    gather_dequantized,
    quantize,
    scatter_kv,
    scatter_quantized,
)

pytestmark = pytest.mark.cuda
HEADS = 8

SPECS = [
    QuantSpec(b, g, s) for b, g, s in itertools.product((2, 3, 4, 5, 6, 8), (32, 64), (False, True))
] + [
    QuantSpec(16),
    QuantSpec(4, 32, rotation="hadamard"),
    QuantSpec(4, 64, rotation="hadamard"),
    QuantSpec(2, 16, True, rotation="hadamard"),
    QuantSpec(8, 64, rotation="hadamard"),
]


def _inputs(n: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """x[n, HEADS, D] on the CPU: scales from 1e-3 to 1e3, NaN (odd payloads too), Inf, a
    constant row, signed zeros and a value beyond fp16's range."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, HEADS, head_dim, generator=g) * torch.logspace(-3, 3, n)[:, None, None]
    x[0, 0, :3] = float("nan")
    x[0, 1, 0] = torch.tensor(0x7F800001, dtype=torch.int32).view(torch.float32)
    x[1, 1, 5] = float("inf")
    x[2, 2] = 0.7
    x[3, 0] = -0.0
    x[4, 1, 1] = 7e4
    return x.to(dtype)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.short())
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_bytes_equal_the_cpu_reference(spec, head_dim, dtype):
    x = _inputs(40, head_dim, dtype)
    loc = torch.randperm(100, generator=torch.Generator().manual_seed(1))[:40]
    expected = quantize(x, spec)
    buf = torch.zeros(100, HEADS, spec.row_bytes(head_dim), dtype=torch.uint8, device="cuda")
    scatter_quantized(buf, loc.cuda(), x.cuda(), spec)
    rows = buf[loc.cuda()].cpu()
    assert torch.equal(rows, expected)  # rotated rows too: the same butterflies in one order
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = gather_dequantized(buf, loc.cuda(), spec, head_dim, out_dtype).cpu()
        ref = dequantize(rows, spec, head_dim, out_dtype)  # the same bytes, on the CPU
        assert _same_values(out, ref)


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(4, 32), QuantSpec(16), QuantSpec(4, 32, rotation="hadamard"), QuantSpec(3, 32)],
    ids=lambda s: s.short(),
)
def test_decode_sized_write_and_read_are_one_launch(spec):
    """[64, 8, 128] bf16 (a decode step of a batch of 64), K sliced from a fused QKV output:
    the write and the read are each one kernel, with no torch op around them."""
    qkv = torch.randn(64, 3 * HEADS, 128, device="cuda", dtype=torch.bfloat16)
    k = qkv[:, HEADS : 2 * HEADS]
    buf = torch.zeros(4096, HEADS, spec.row_bytes(128), dtype=torch.uint8, device="cuda")
    loc = torch.randperm(4096, device="cuda")[:64]
    assert cuda_kernel_launches(lambda: scatter_quantized(buf, loc, k, spec)) == 1
    read = lambda: gather_dequantized(buf, loc, spec, 128, torch.bfloat16)  # noqa: E731
    assert cuda_kernel_launches(read) == 1


@pytest.mark.parametrize(
    ("k_spec", "v_spec"),
    [(QuantSpec(4, 32), QuantSpec(4, 32)), (QuantSpec(8, 64), QuantSpec(4, 32)),
     (QuantSpec(4, 32, rotation="hadamard"), QuantSpec(3, 32))],
    ids=lambda s: s.short(),
)  # fmt: skip
def test_a_decode_steps_k_and_v_are_one_launch_of_each_sides_bytes(k_spec, v_spec):
    """K and V of a decode step of 64 (sliced from a fused QKV output) packed by one kernel,
    each side's bytes those of its own launch."""
    qkv = torch.randn(64, 3 * HEADS, 128, device="cuda", dtype=torch.bfloat16)
    k, v = qkv[:, HEADS : 2 * HEADS], qkv[:, 2 * HEADS :]
    bufs = [torch.zeros(4096, HEADS, s.row_bytes(128), dtype=torch.uint8, device="cuda")
            for s in (k_spec, v_spec)]  # fmt: skip
    loc = torch.randperm(4096, device="cuda")[:64]
    assert cuda_kernel_launches(lambda: scatter_kv(*bufs, loc, k, v, k_spec, v_spec)) == 1
    for buf, x, spec in zip(bufs, (k, v), (k_spec, v_spec), strict=True):
        alone = torch.zeros_like(buf)
        scatter_quantized(alone, loc, x, spec)
        assert torch.equal(buf, alone)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_channel_pages_equal_the_cpu_reference(bits, dtype):
    from kvtuner.quant.slot_ops import pack_channel_pages

    spec = QuantSpec(bits, 32, axis="channel")
    x = _inputs(4 * 32, 128, dtype).reshape(4, 32, HEADS, 128)  # 4 full pages
    pages = torch.tensor([5, 0, 9, 2])
    blocks = torch.zeros(10, HEADS, spec.block_bytes(128), dtype=torch.uint8, device="cuda")
    pack_channel_pages(blocks, pages.cuda(), x.cuda(), spec)  # one Triton launch
    assert torch.equal(blocks[pages.cuda()].cpu(), quantize(x.transpose(1, 2), spec).squeeze(2))
