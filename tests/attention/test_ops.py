"""torch.ops.kvtuner: the slots' K+V pack and decode ops pass torch's own op checks (schema, fake
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


def pack_args(planes: bool = False):
    loc = torch.tensor([3, 7, 11], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, HEADS, DIM, generator=gen), torch.randn(3, HEADS, DIM, generator=gen)
    texts = (spec_text(SPECS[0]), spec_text(SPECS[1]))
    return pool(SPECS[0]), pool(SPECS[1]), loc, k, v, *texts, planes, planes


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
def test_pack_op_is_scatter_quantized_of_each_side(planes):
    args = pack_args(planes)
    torch.library.opcheck(torch.ops.kvtuner.pack_kv_slots.default, args)
    got = [args[0].clone(), args[1].clone()]
    torch.ops.kvtuner.pack_kv_slots(*got, *args[2:])
    for rows, side, x, spec in zip(got, args[:2], args[3:5], SPECS, strict=True):
        want = side.clone()
        scatter_quantized(want, args[2], x, spec, planes=planes)
        assert torch.equal(rows, want) and rows.any()


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
