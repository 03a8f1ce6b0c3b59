"""The decode kernel's GPU branches (``packed_rows.PTX``: inline PTX for masks, pairs and fp16
fmas) run under Triton's interpreter, their assembly evaluated as the PTX ISA defines it
(``ptx_subset``), against the interpreter's own branches and the torch reference. Those branches
run on no CPU otherwise: this is where a wrong selector, constant or operand in their text
shows before a GPU is at hand."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import triton.language as tl
from ptx_subset import create_inline_asm, lop3, prmt, run
from test_channel_pages import LENGTHS
from test_channel_pages import args as pages_args
from test_channel_pages import pool as pages_pool
from test_decode import D
from test_decode_kernel import gen, pool
from test_prerope import OFFSETS, llama_freq
from triton.runtime.interpreter import InterpreterBuilder

from kvtuner.attention import AttentionBatch, decode_attention_reference, packed_rows
from kvtuner.attention.decode_kernel import launch_decode, plan_decode
from kvtuner.quant import QuantSpec


def test_the_ptx_subset_follows_the_isa():
    """Worked examples of the ISA's definitions: ``lop3``'s table 0xEA is (a & b) | c and 0x80 a
    & b & c; ``prmt`` 0x5410 joins the low halves of a and b, 0x7632 the high ones, and a
    selector nibble with bit 3 set replicates its byte's sign; ``sub.rn.f16x2`` and
    ``fma.rn.f16x2`` act on each half."""
    a, b, c = np.uint32(0x12345678), np.uint32(0x0F0F00FF), np.uint32(0x64006400)
    assert lop3(a, b, c, 0xEA) == (a & b) | c and lop3(a, b, c, 0x80) == a & b & c
    assert prmt(a, np.uint32(0x9ABCDEF0), np.uint32(0x5410)) == 0xDEF05678
    assert prmt(a, np.uint32(0x9ABCDEF0), np.uint32(0x7632)) == 0x9ABC1234
    assert prmt(np.uint32(0x80), np.uint32(0), np.uint32(0x8888)) == 0xFFFFFFFF
    words = np.array([0x6400640F, 0x64806401], np.uint32)  # fp16 pairs 1024 + c
    halves = run("{.reg .b32 t; mov.b32 t, 0x64006400; sub.rn.f16x2 $0, $1, t;}", [words])
    assert np.array_equal(halves.view(np.float16), np.array([15, 0, 1, 128], np.float16))
    x, s, z = (np.array([v], np.float16).repeat(2).view(np.uint32) for v in (3, 0.5, -1))
    fma = run("fma.rn.f16x2 $0, $1, $2, $3;", [x, s, z])
    assert np.array_equal(fma.view(np.float16), np.array([0.5, 0.5], np.float16))


ROWS = [  # head_dim 128: every branch with inline PTX, and the instructions each takes
    (QuantSpec(4), QuantSpec(4), {"lop3", "fma", "prmt"}),  # keys in place, value rows paired
    (QuantSpec(2), QuantSpec(2), {"lop3", "fma"}),  # 2-bit values read in place too
    (QuantSpec(4, symmetric=True), QuantSpec(4, symmetric=True), {"lop3", "fma", "prmt"}),
    (QuantSpec(8, group_size=64), QuantSpec(4), {"lop3", "sub", "fma", "prmt"}),  # K8V4
    (QuantSpec(8, group_size=64), QuantSpec(8, group_size=64), {"lop3"}),  # dotted 1024 + c
    (QuantSpec(4, pre_rope=True), QuantSpec(4), {"lop3", "fma", "prmt"}),  # whole-row spans
    (QuantSpec(3), QuantSpec(3), {"lop3", "sub", "fma"}),  # two planes, keys in key lane order
]


def _decode(k_spec, v_spec, q, rows, kw):
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=rows[0], v_rows=rows[1], k_spec=k_spec,
                           v_spec=v_spec, **kw)  # fmt: skip
    return launch_decode(batch, batch.q, None, None, plan_decode(batch)).squeeze(1).float()


def _gpu_branches(monkeypatch) -> set:
    """``packed_rows.PTX`` set, the interpreter's inline assembly run by ``ptx_subset``: the
    instructions taken are collected in the set returned."""
    seen = set()

    def asm(builder, text, *rest):
        seen.update(re.findall(r"(lop3|prmt|sub|fma)\.", text))
        return create_inline_asm(builder, text, *rest)

    monkeypatch.setattr(packed_rows, "PTX", tl.constexpr(True))
    monkeypatch.setattr(InterpreterBuilder, "create_inline_asm", asm)
    return seen


@pytest.mark.parametrize("k_spec,v_spec,ops", ROWS, ids=lambda s: getattr(s, "short", str)())
def test_the_gpu_branches_give_the_interpreters_results(k_spec, v_spec, ops, monkeypatch):
    """fp16 q (the GPU's path), one-warp tiles: the PTX branches' results match the
    interpreter's branches within fp16 rounding (2e-3) and the reference within 1e-2, each
    row's PTX seen taken. Seen to fail (checked): ``prmt``'s selectors swapped (3.5-3.9 off on
    the 4-bit value rows), ``lop3``'s table 0xF8 for 0xEA (NaN on every row that takes it),
    ``sub.f16x2``'s operands swapped (4.3-11.4 off)."""
    args, kw = pool(k_spec, v_spec, lengths=[100, 40, 1], dim=128)
    if k_spec.pre_rope:
        kw |= dict(rope_freq=llama_freq(64), rope_offset=OFFSETS)
    q = (torch.randn(3, 8, 128, generator=gen(11)) * 2).half()
    plain = _decode(k_spec, v_spec, q, args, kw)
    seen = _gpu_branches(monkeypatch)
    gpu = _decode(k_spec, v_spec, q, args, kw)
    assert seen == ops
    want = decode_attention_reference(q.float(), *args, **kw)
    torch.testing.assert_close(gpu, plain, atol=2e-3, rtol=0)
    torch.testing.assert_close(gpu, want, atol=1e-2, rtol=0)


def test_kivi_pages_read_in_place_on_the_gpu_branches(monkeypatch):
    """KIVI pages of 4-bit keys (32 slots) as Triton 3.6 builds them (``PAGES_IN_BYTE``: codes
    read in place in their byte, ``lop3`` and ``fma``), with 4-bit value rows (``prmt``):
    within 2e-3 of the interpreter's branches and 1e-2 of the reference."""
    k_spec, v_spec = QuantSpec(4, group_size=32, axis="channel"), QuantSpec(4)
    rows, index = pages_args(*pages_pool(k_spec, v_spec, page=32), k_spec, v_spec)
    q = (torch.randn(len(LENGTHS), 4, D, generator=gen(12)) * 2).half()
    plain = _decode(k_spec, v_spec, q, rows, index)
    seen = _gpu_branches(monkeypatch)
    monkeypatch.setattr(packed_rows, "PAGES_IN_BYTE", tl.constexpr(True))
    gpu = _decode(k_spec, v_spec, q, rows, index)
    assert seen == {"lop3", "fma", "prmt"}
    want = decode_attention_reference(q.float(), *rows, **index)
    torch.testing.assert_close(gpu, plain, atol=2e-3, rtol=0)
    torch.testing.assert_close(gpu, want, atol=1e-2, rtol=0)
