"""The PTX instructions of the kernels' inline assembly (``packed_rows``' GPU branches), run on
numpy arrays as the PTX ISA defines them, so that Triton's CPU interpreter can take those branches:
``lop3.b32``, ``prmt.b32``, ``mov.b32``, ``sub.rn.f16x2`` and ``fma.rn.f16x2``, in blocks of
``{.reg .b32 t; ...}``. It checks the assembly's text against the ISA, not ptxas or a GPU
(``pytest -m cuda`` on one). The f16x2 arithmetic is done in float64 and rounded to fp16 once:
exact for these kernels' operands (codes, scales, zeros and their products)."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

_NUMPY = {tl.int32: np.int32, tl.uint32: np.uint32, tl.float16: np.float16}


def lop3(a, b, c, lut: int) -> np.ndarray:
    """Bit i of the result is bit (a_i·4 + b_i·2 + c_i) of ``lut`` (ta = 0xF0, tb = 0xCC,
    tc = 0xAA)."""
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
    for index in range(8):
        if lut >> index & 1:
            term = np.uint32(0xFFFFFFFF)
            for bit, x in zip((4, 2, 1), (a, b, c), strict=True):
                term = term & (x if index & bit else ~x)
            out |= term
    return out


def prmt(a, b, selector) -> np.ndarray:
    """Default mode: byte i of the result is byte (selector nibble i & 7) of b:a (a's bytes 0-3,
    b's 4-7), or that byte's sign bit replicated where the nibble's bit 3 is set."""
    bytes_ = [(x >> np.uint32(8 * k)) & np.uint32(0xFF) for x in (a, b) for k in range(4)]
    out = np.zeros(np.broadcast(a, b, selector).shape, np.uint32)
    for i in range(4):
        nibble = (selector >> np.uint32(4 * i)) & np.uint32(0xF)
        byte = np.choose(nibble & np.uint32(7), bytes_)
        byte = np.where(nibble & np.uint32(8), np.where(byte & np.uint32(0x80), 0xFF, 0), byte)
        out |= byte.astype(np.uint32) << np.uint32(8 * i)
    return out


def _f16x2(fn, *words) -> np.ndarray:
    """fn on each 16-bit half of the words, as fp16, rounded to fp16 once."""
    halves = []
    for shift in (0, 16):
        args = [((w >> np.uint32(shift)) & np.uint32(0xFFFF)).astype(np.uint16) for w in words]
        result = fn(*(x.view(np.float16).astype(np.float64) for x in args))
        halves.append(result.astype(np.float16).view(np.uint16).astype(np.uint32) << shift)
    return halves[0] | halves[1]


OPS = {
    "mov.b32": lambda a: a,
    "lop3.b32": lambda a, b, c, lut: lop3(a, b, c, int(lut)),
    "prmt.b32": prmt,
    "sub.rn.f16x2": lambda a, b: _f16x2(lambda x, y: x - y, a, b),
    "fma.rn.f16x2": lambda a, b, c: _f16x2(lambda x, y, z: x * y + z, a, b, c),
}


def run(asm: str, inputs: list[np.ndarray]) -> np.ndarray:
    """uint32 $0 of ``asm`` given uint32 $1, $2, ... (``inputs``)."""
    regs = {f"${i + 1}": x for i, x in enumerate(inputs)}
    for line in asm.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *srcs = (s.strip() for s in rest.split(","))
        values = [regs[s] if s in regs else np.uint32(int(s, 0)) for s in srcs]
        regs[dst] = OPS[op](*values)
    return regs["$0"]


class _Call:
    def __init__(self, handles):
        self.handles = handles

    def get_result(self, i: int):
        return self.handles[i]


def create_inline_asm(builder, asm, constraints, values, types, is_pure, pack):
    """The interpreter's ``create_inline_asm``: each input as 32-bit words (``pack`` 16-bit
    elements a word, the first in the low half), one output."""
    assert constraints.count("=") == 1 and pack in (1, 2), (constraints, pack)
    shape = values[0].data.shape
    words = [np.ascontiguousarray(v.data).reshape(-1).view(np.uint32) for v in values]
    out = np.asarray(run(asm, words), np.uint32)
    scalar = types[0].scalar
    data = np.broadcast_to(out, words[0].shape).view(_NUMPY[scalar]).reshape(shape)
    return _Call([TensorHandle(data.copy(), scalar)])
