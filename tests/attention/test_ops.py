"""torch.ops.kvtuner: the slot pack and decode ops pass torch's own op checks (schema, fake
tensors, mutation declared) and give the functions they wrap."""

from __future__ import annotations

import pytest
import torch

from kvtuner.attention import decode_attention_reference
from kvtuner.attention.ops import spec_text
from kvtuner.quant import QuantSpec
from kvtuner.quant.slot_ops import scatter_quantized

SPECS = (QuantSpec(4), QuantSpec(8, 64))
HEADS, DIM, SLOTS = 2, 128, 24


def pool(spec: QuantSpec) -> torch.Tensor:
    return torch.zeros(SLOTS, HEADS, spec.row_bytes(DIM), dtype=torch.uint8)


def pack_args(spec: QuantSpec, planes: bool = False):
    loc = torch.tensor([3, 7, 11], dtype=torch.int32)
    x = torch.randn(3, HEADS, DIM, generator=torch.Generator().manual_seed(0))
    return pool(spec), loc, x, spec_text(spec), planes


def decode_args(kernel: bool, starts: bool = False):
    gen = torch.Generator().manual_seed(1)
    k, v = pool(SPECS[0]), pool(SPECS[1])
    table = torch.arange(SLOTS, dtype=torch.int32).view(2, SLOTS // 2)
    x = torch.randn(SLOTS, HEADS, DIM, generator=gen)
    scatter_quantized(k, table.flatten(), x, SPECS[0])
    scatter_quantized(v, table.flatten(), x.flip(0), SPECS[1])
    q = torch.randn(2, 4, DIM, generator=gen)
    lengths = torch.tensor([9, 12], dtype=torch.int32)
    first = torch.tensor([2, 0], dtype=torch.int32) if starts else None
    return (q, k, v, table, lengths, first, None, spec_text(SPECS[0]), spec_text(SPECS[1]),
            DIM**-0.5, 0, False, kernel)  # fmt: skip


@pytest.mark.parametrize("planes", [False, True])
def test_pack_op_is_scatter_quantized(planes):
    args = pack_args(SPECS[0], planes)
    torch.library.opcheck(torch.ops.kvtuner.pack_slots.default, args)
    got, want = args[0].clone(), args[0].clone()
    torch.ops.kvtuner.pack_slots(got, *args[1:])
    scatter_quantized(want, args[1], args[2], SPECS[0], planes=planes)
    assert torch.equal(got, want) and got.any()


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("starts", [False, True])
def test_decode_op_is_the_kernels_attention(kernel, starts):
    args = decode_args(kernel, starts)
    torch.library.opcheck(torch.ops.kvtuner.decode_slots.default, args)
    q, k, v, table, lengths, first = args[:6]
    want = decode_attention_reference(q, k, v, *SPECS, slot_table=table, lengths=lengths,
                                      starts=first)  # fmt: skip
    got = torch.ops.kvtuner.decode_slots(*args)
    assert got.dtype == q.dtype and got.shape == q.shape
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
