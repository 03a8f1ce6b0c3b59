"""Triton kernels vs the torch reference, on CPU tensors under Triton's interpreter.

Triton builds its own language functions (``tl.zeros``, ``tl.max``...) when it is first imported,
for the interpreter only if ``TRITON_INTERPRET=1`` is set by then. So this module sets it before
importing triton. If another test imported triton earlier in this process, the kernels cannot be
interpreted here: the module's tests then say so and ``test_in_fresh_process`` runs them all in
a new interpreter.
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported in this process

import importlib  # noqa: E402
import itertools  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import hypothesis.extra.numpy as hnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from fresh_process import pass_in_fresh_process  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_golden import GOLDEN, X  # noqa: E402  (tests/quant is on sys.path)

from kvtuner.quant import QuantSpec, dequantize, quantize  # noqa: E402
from kvtuner.quant.planes import to_planes  # noqa: E402
from kvtuner.quant.reference import _group_grid  # noqa: E402

# the interpreter runs numpy: fp16 overflow (7e4) and NaN arithmetic are expected here
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
SLOTS, HEADS = 11, 3
LOC = torch.tensor([7, 1, 3, 10, 0])


def _interpreted_kernels():
    """kvtuner.quant.triton_kernels built for the interpreter, or None if this process can't."""
    module = importlib.import_module("kvtuner.quant.triton_kernels")
    if not module.interpreted():
        module = importlib.reload(module)  # the module was imported before the env var was set
    return module if module.interpreted() else None


TK = _interpreted_kernels()
TOO_LATE = "triton was imported before TRITON_INTERPRET=1; see test_in_fresh_process"


@pytest.fixture(scope="module")
def tk():
    if TK is None:
        pytest.skip(TOO_LATE)
    return TK


if TK is None:

    def test_in_fresh_process():
        """Run this module where TRITON_INTERPRET=1 is set before triton is imported."""
        pass_in_fresh_process(__file__)


def _cases():
    """(spec, head_dim): every bits x symmetric x group, 16 bits, Hadamard; D = 64 and 96.
    3/5/6 bits (low and high planes) at fewer groups, D = 96 asymmetric only (time), and D = 72
    (a high word part-filled)."""
    specs = [
        QuantSpec(b, g, s) for b, s, g in itertools.product((2, 4, 8), (False, True), (2, 8, 32))
    ]
    specs.append(QuantSpec(16))
    for spec in specs:
        yield pytest.param(spec, 64, id=f"{spec.short()}-d64")
        yield pytest.param(spec, 96, id=f"{spec.short()}-d96")  # 96: a non-power-of-two tile
    for b, s, g in itertools.product((3, 5, 6), (False, True), (8, 32)):
        spec = QuantSpec(b, g, s)
        yield pytest.param(spec, 64, id=f"{spec.short()}-d64")
        if not s and g == 32:
            yield pytest.param(spec, 96, id=f"{spec.short()}-d96")  # 12 words padded to 16
    yield pytest.param(QuantSpec(3, 2), 64, id="3b/g2/asym/token-d64")
    for b in (3, 5, 6):  # a high plane's last word part-filled (channel order there)
        yield pytest.param(QuantSpec(b, 8), 72, id=f"{b}b/g8/asym/token-d72")
    for spec in (
        QuantSpec(4, 32, rotation="hadamard"),
        QuantSpec(2, 16, True, rotation="hadamard"),
        QuantSpec(3, 32, rotation="hadamard"),
        QuantSpec(8, 64, rotation="hadamard"),
    ):
        yield pytest.param(spec, 64, id=f"{spec.short()}-d64")
    yield pytest.param(QuantSpec(4, 32, rotation="hadamard"), 128, id="4b/g32/had-d128")


def _inputs(head_dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """x[5, HEADS, D] with the awkward cases: NaN, ±Inf, constant and all-(-0.0) rows."""
    g = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(len(LOC), HEADS, head_dim, generator=g)
        * torch.logspace(-3, 3, len(LOC))[:, None, None]
    )
    x[0, 0, :3] = float("nan")
    x[1, 1, 5] = float("inf")
    x[2, 2] = 0.7
    x[3, 0] = -0.0
    x[4, 1, 1] = 7e4  # beyond fp16's range
    x[4, 0, 2] = float("-inf")  # a group's min (the kernels take NaN-propagating min and max)
    return x.to(dtype)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal where finite; NaN exactly where the other is NaN (payloads may differ)."""
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    return torch.equal(
        torch.where(nan, 0, a).view(torch.int16 if a.element_size() == 2 else torch.int32),
        torch.where(nan, 0, b).view(torch.int16 if a.element_size() == 2 else torch.int32),
    )


def _same_up_to_summation_order(a: torch.Tensor, b: torch.Tensor) -> bool:
    """fp32 reads of Hadamard rows: the inverse rotation is a D-term dot per element, summed in
    another order by the interpreter's numpy BLAS than by torch's on some CPUs (bitwise equal on
    Intel, a few ulps of the row's scale apart on AMD): NaN where the other is NaN, else within
    4e-6 of the row's largest |value| (measured 6.4e-7 at D = 128)."""
    nan = a.isnan() | b.isnan()
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = torch.where(nan, 0, a), torch.where(nan, 0, b)
    row = torch.nan_to_num(b, posinf=0, neginf=0).abs().amax(-1, keepdim=True)
    finite = a.isfinite() & b.isfinite()
    return torch.equal(a[~finite], b[~finite]) and bool(
        ((a - b).abs() <= 4e-6 * row).where(finite, True).all()
    )


@pytest.mark.parametrize(("spec", "head_dim"), list(_cases()))
def test_scatter_gather_match_reference(tk, spec, head_dim):
    for dtype in (torch.float32, torch.bfloat16):
        x = _inputs(head_dim, dtype)
        buf = torch.randint(0, 256, (SLOTS, HEADS, spec.row_bytes(head_dim)), dtype=torch.uint8)
        expected = buf.clone()
        expected[LOC] = quantize(x, spec)
        tk.triton_scatter_quantized(buf, LOC, x, spec)
        assert torch.equal(buf, expected)  # given slots byte-identical, all others untouched
        for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
            out = tk.triton_gather_dequantized(buf, LOC.int(), spec, head_dim, out_dtype)
            ref = dequantize(expected[LOC], spec, head_dim, out_dtype)
            assert out.dtype == out_dtype and out.shape == (len(LOC), HEADS, head_dim)
            if spec.rotation == "hadamard" and out_dtype == torch.float32:
                assert _same_up_to_summation_order(out, ref)
            else:
                assert _same_values(out, ref)


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(4, 64), QuantSpec(8, 32), QuantSpec(4, 16, True), QuantSpec(3, 32),
     QuantSpec(2, 8, rotation="hadamard"), QuantSpec(4, 32, rotation="hadamard")],
    ids=lambda s: s.short(),
)  # fmt: skip
@pytest.mark.parametrize("blocks", [1, 3])  # 3: row blocks in a loop, copied ahead
def test_scatter_gather_lay_out_planes(tk, spec, blocks):
    """Planes (a slot's codes of every head, then their scales and zeros): the reference's rows
    moved to planes byte for byte, other slots untouched, read back as the rows read."""
    x = _inputs(64, torch.bfloat16)
    buf = torch.randint(0, 256, (SLOTS, HEADS, spec.row_bytes(64)), dtype=torch.uint8)
    expected = buf.clone()
    expected[LOC] = to_planes(quantize(x, spec), spec, 64)
    plan = tk.PoolPlan(2, 1, blocks=3, stages=2) if blocks > 1 else None
    tk.triton_scatter_quantized(buf, LOC, x, spec, planes=True, plan=plan)
    assert torch.equal(buf, expected)
    out = tk.triton_gather_dequantized(buf, LOC, spec, 64, planes=True, plan=plan)
    ref = dequantize(quantize(x, spec), spec, 64)
    same = _same_up_to_summation_order if spec.rotation == "hadamard" else _same_values
    assert same(out, ref)


def test_planes_refuse_rows_they_cannot_lay_out(tk):
    spec = QuantSpec(4, 64, True)  # one symmetric scale a row: 2 bytes, no whole word
    buf = torch.zeros(SLOTS, HEADS, spec.row_bytes(64), dtype=torch.uint8)
    with pytest.raises(ValueError, match="planes need quantized token rows of whole words"):
        tk.triton_scatter_quantized(buf, LOC, _inputs(64, torch.float32), spec, planes=True)


@settings(max_examples=30, deadline=None)
@given(
    data=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.just(2), st.just(32)),
        elements=st.floats(width=32),
    ),  # any float32: subnormals, huge, NaN, Inf
    spec=st.sampled_from(
        [
            *(QuantSpec(2, 8), QuantSpec(4, 32, True), QuantSpec(8, 16), QuantSpec(4, 2)),
            *(QuantSpec(3, 8), QuantSpec(5, 16, True), QuantSpec(6, 32)),
        ]
    ),
)
def test_scatter_matches_reference_on_any_float(tk, data, spec):
    """Directed fp16 rounding of the metadata is where torch and Triton could part ways."""
    x = torch.from_numpy(data)
    loc = torch.arange(x.shape[0]).flip(0)
    buf = torch.zeros(x.shape[0], 2, spec.row_bytes(32), dtype=torch.uint8)
    tk.triton_scatter_quantized(buf, loc, x, spec)
    assert torch.equal(buf[loc], quantize(x, spec))
    assert _same_values(
        tk.triton_gather_dequantized(buf, loc, spec, 32), dequantize(buf[loc], spec, 32)
    )


def _adversarial(kind: int, g: torch.Generator) -> torch.Tensor:
    """x[6, 2, 64] of one kind: any magnitude, ties on a 1/7 grid, fp16's whole range, tiny,
    bf16 values, or infinities and values beyond fp16."""
    shape = (6, 2, 64)
    if kind == 0:
        return torch.randn(shape, generator=g) * 10.0 ** torch.randint(-40, 38, (1,), generator=g)
    if kind == 1:
        return torch.randint(-300, 300, shape, generator=g).float() / 7
    if kind == 2:
        return torch.rand(shape, generator=g) * 131008 - 65504
    if kind == 3:
        return torch.randn(shape, generator=g) * 1e-6
    if kind == 4:
        return torch.randn(shape, generator=g).bfloat16().float() * 3
    x = torch.randn(shape, generator=g)
    x[0, 0, :5], x[1, 1, 3] = float("inf"), 7e4
    return x


def test_codes_match_the_reference_on_adversarial_batches(tk):
    """The encoder's rule (one 1/scale a group) and the kernel's clamp-free truncation give the
    reference's bytes on every width, symmetric or not, at every kind of input."""
    g = torch.Generator().manual_seed(0)
    widths = itertools.product((2, 3, 4, 5, 6, 8), (8, 32), (False, True))
    for i, (bits, group, sym) in enumerate(widths):
        spec, x = QuantSpec(bits, group, sym), _adversarial(i % 6, g)
        buf = torch.zeros(6, 2, spec.row_bytes(64), dtype=torch.uint8)
        loc = torch.randperm(6, generator=g)
        tk.triton_scatter_quantized(buf, loc, x, spec)
        assert torch.equal(buf[loc], quantize(x, spec)), (spec.short(), i % 6)


# fp32 bits of a 4-bit g32 group where (x - zero) / scale and (x - zero) * (1 / scale) round
# one element to different codes (found by search over random groups)
RULE_ROW = [
    -1089746586,
    -1100460916,
    -1097161766,
    -1085048191,
    -1086653795,
    1060163248,
    1079939868,
    1053807026,
    -1071743552,
    -1066585550,
    -1085086192,
    1082254580,
    1080077662,
    1079256584,
    -1087313505,
    1076675003,
    1081121944,
    -1077299530,
    1049487366,
    -1080320404,
    -1066939982,
    -1089514008,
    1069056607,
    1073251570,
    1082633215,
    1084033179,
    1089766939,
    1080288870,
    -1074334148,
    1077839024,
    1057634896,
    1077588306,
]


def test_codes_follow_the_groups_reciprocal_where_division_differs(tk):
    """One IEEE 1/scale a group, then a multiply: the kernel's bytes are the reference's on a
    group where dividing each element would pick another code."""
    spec = QuantSpec(4, 32)
    x = torch.tensor(RULE_ROW, dtype=torch.int32).view(torch.float32).view(1, 1, 32)
    buf = torch.zeros(1, 1, spec.row_bytes(32), dtype=torch.uint8)
    tk.triton_scatter_quantized(buf, torch.tensor([0]), x, spec)
    assert torch.equal(buf, quantize(x, spec))
    codes, scale, zero = _group_grid(x.view(1, 32).clone(), spec, -1)
    assert not torch.equal(codes, ((x.view(1, 32) - zero) / scale + 0.5).floor())


@pytest.mark.parametrize("name", [n for n in sorted(GOLDEN) if GOLDEN[n][0].axis == "token"])
def test_kernels_write_the_golden_bytes(tk, name):
    """The literal rows of the format (tests/quant/test_golden.py), head_dim 16."""
    spec, rows = GOLDEN[name]
    buf = torch.zeros(3, 1, spec.row_bytes(16), dtype=torch.uint8)
    loc = torch.tensor([2, 0])
    tk.triton_scatter_quantized(buf, loc, X[:, None], spec)
    assert [bytes(r.tolist()).hex() for r in buf[loc, 0]] == rows
    out = tk.triton_gather_dequantized(buf, loc, spec, 16)
    assert _same_values(out, dequantize(buf[loc], spec, 16))


def test_many_rows_span_several_programs(tk):
    """More tokens than one BLOCK (32): program boundaries and the tail mask."""
    spec = QuantSpec(4, 32)
    loc = torch.randperm(400)[:70]
    x = torch.randn(70, 2, 64)
    buf = torch.zeros(400, 2, spec.row_bytes(64), dtype=torch.uint8)
    expected = buf.clone()
    expected[loc] = quantize(x, spec)
    tk.triton_scatter_quantized(buf, loc, x, spec)
    assert torch.equal(buf, expected)
    assert torch.equal(
        tk.triton_gather_dequantized(buf, loc, spec, 64), dequantize(expected[loc], spec, 64)
    )


KV_PAIRS = [  # (K spec, V spec, planes)
    (QuantSpec(4, 32), QuantSpec(4, 32), (False, False)),
    (QuantSpec(8, 64), QuantSpec(4, 32), (False, False)),  # K8V4: each side its constants
    (QuantSpec(4, 32, rotation="hadamard"), QuantSpec(2, 32), (False, False)),  # 1 vs 3 programs
    (QuantSpec(3, 32), QuantSpec(4, 16, True), (False, False)),
    (QuantSpec(8, 32), QuantSpec(4, 64), (True, True)),
    (QuantSpec(16), QuantSpec(4, 32), (False, False)),  # a 16-bit side: a launch a side
]


@pytest.mark.parametrize("tokens", [5, 70])
@pytest.mark.parametrize(
    ("k_spec", "v_spec", "planes"), KV_PAIRS, ids=lambda v: getattr(v, "short", lambda: "")()
)
def test_kv_in_one_launch_writes_what_each_side_alone_writes(tk, k_spec, v_spec, planes, tokens):
    """K and V packed by one launch (grid axis 2 the side, each side's own plan, block count
    and constants): each buffer holds the reference's bytes at ``loc``, other slots untouched."""
    g = torch.Generator().manual_seed(tokens)
    loc = torch.randperm(400, generator=g)[:tokens]
    k, v = (torch.randn(tokens, 2, 64, generator=g, dtype=torch.bfloat16) for _ in "kv")
    k = k.float() if tokens == 5 else k  # smoothed keys come as fp32 beside bf16 values
    bufs, expected = [], []
    for x, spec, side_planes in zip((k, v), (k_spec, v_spec), planes, strict=True):
        buf = torch.randint(0, 256, (400, 2, spec.row_bytes(64)), dtype=torch.uint8, generator=g)
        want, rows = buf.clone(), quantize(x, spec)
        want[loc] = to_planes(rows, spec, 64) if side_planes else rows
        bufs.append(buf)
        expected.append(want)
    tk.triton_scatter_kv(*bufs, loc, k, v, k_spec, v_spec, planes=planes)
    assert torch.equal(bufs[0], expected[0]) and torch.equal(bufs[1], expected[1])


def test_kv_in_one_launch_checks_both_sides(tk):
    spec, loc = QuantSpec(4, 32), LOC
    buf = torch.zeros(SLOTS, HEADS, spec.row_bytes(64), dtype=torch.uint8)
    k = torch.zeros(5, HEADS, 64)
    with pytest.raises(ValueError, match="heads or head_dim"):
        narrow = torch.zeros(SLOTS, HEADS, spec.row_bytes(32), dtype=torch.uint8)
        tk.triton_scatter_kv(buf, narrow, loc, k, torch.zeros(5, HEADS, 32), spec, spec)
    with pytest.raises(ValueError, match="x must be"):
        tk.triton_scatter_kv(buf, buf.clone(), loc, k, torch.zeros(4, HEADS, 64), spec, spec)
    empty = torch.zeros(0, dtype=torch.long)
    before = buf.clone()
    tk.triton_scatter_kv(buf, buf, empty, k[:0], k[:0], spec, spec)
    assert torch.equal(buf, before)


BUF_16 = torch.zeros(SLOTS, HEADS, 128, dtype=torch.uint8)  # 16-bit rows of head_dim 64
PLANS = [
    dict(block_rows=8, num_warps=1),  # a pack at decode sizes (PoolPlan.filling)
    dict(block_rows=16, num_warps=4),
    dict(block_rows=8, num_warps=2, whole_rows=True),
    dict(block_rows=8, num_warps=1, blocks=3, stages=3),
    dict(block_rows=16, num_warps=1, whole_rows=True, blocks=2, stages=2),
]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize(
    ("spec", "head_dim"),
    [
        (QuantSpec(4, 32), 64),
        (QuantSpec(3, 32), 96),
        (QuantSpec(2, 8, True), 64),
        (QuantSpec(8, 64, rotation="hadamard"), 64),
        (QuantSpec(16), 64),
    ],
    ids=lambda v: v.short() if isinstance(v, QuantSpec) else f"d{v}",
)
def test_every_plan_writes_and_reads_the_reference(tk, plan, spec, head_dim):
    """A plan moves the same bytes: rows a block, warps, a whole row a thread, several row
    blocks a program in a pipelined loop (70 tokens: blocks that do not divide them)."""
    plan = tk.PoolPlan(**plan)
    if not spec.is_quantized and plan.whole_rows:
        with pytest.raises(ValueError, match="whole_rows=False"):
            tk.triton_scatter_quantized(BUF_16, LOC, torch.zeros(5, HEADS, 64), spec, plan=plan)
        return
    loc = torch.randperm(400, generator=torch.Generator().manual_seed(1))[:70]
    x = torch.randn(70, 2, head_dim, generator=torch.Generator().manual_seed(2))
    buf = torch.zeros(400, 2, spec.row_bytes(head_dim), dtype=torch.uint8)
    expected = buf.clone()
    expected[loc] = quantize(x, spec)
    tk.triton_scatter_quantized(buf, loc, x, spec, plan=plan)
    assert torch.equal(buf, expected)
    out = tk.triton_gather_dequantized(buf, loc, spec, head_dim, torch.bfloat16, plan=plan)
    assert _same_values(out, dequantize(expected[loc], spec, head_dim, torch.bfloat16))


def test_plans_check_their_fields_and_the_default_plans(tk):
    for bad in (dict(block_rows=24), dict(num_warps=3), dict(blocks=0), dict(stages=0)):
        with pytest.raises(ValueError, match="need"):
            tk.PoolPlan(**bad)
    assert tk.plan_pool(QuantSpec(4, 32), pack=True) == tk.PoolPlan(32, 1)
    assert tk.plan_pool(QuantSpec(4, 32), pack=False) == tk.PoolPlan(32, 4)
    hadamard = QuantSpec(4, 32, rotation="hadamard")
    assert tk.plan_pool(hadamard, pack=False) == tk.PoolPlan(32, 1, whole_rows=True)
    assert tk.plan_pool(hadamard, pack=True).stages > 1  # its copies ahead of the butterflies


def test_decode_sized_packs_fill_the_sms_with_smaller_row_blocks(tk):
    """At decode sizes a pack takes one program's time: its row blocks halve, down to 8 rows,
    until the launch holds a program an SM (8 KV heads, 132 SMs); large launches, a whole row
    a thread and the CPU (no SM count) keep the plan."""
    plan = tk.PoolPlan(32, 1)
    assert plan.filling(16, 8, 132) == tk.PoolPlan(8, 1)  # batch 16: 16 programs, not 8
    assert plan.filling(256, 8, 132) == tk.PoolPlan(8, 1)  # 256 programs, not 64
    assert plan.filling(512, 8, 132) == tk.PoolPlan(16, 1)  # 256 programs, not 128
    assert plan.filling(1024, 8, 132) is plan
    assert plan.filling(16, 8, None) is plan
    whole = tk.PoolPlan(32, 1, whole_rows=True, blocks=8, stages=3)
    assert whole.filling(16, 8, 132) is whole


def test_a_launch_past_a_grids_second_axis_takes_more_row_blocks_a_program(tk):
    """Heads are grid axis 0 (a token block's heads run side by side) and programs axis 1,
    which CUDA caps at 65535: more row blocks then go to each program, not past the cap."""
    spec, n = QuantSpec(4, 32), 32 * 65535 + 5
    buf = torch.empty(1, 8, spec.row_bytes(128), dtype=torch.uint8).expand(n, 8, -1)
    loc = torch.empty(1, dtype=torch.int64).expand(n)
    grid, args = tk._launch_args(buf, loc, spec, 128, tk.PoolPlan(32, 1))
    assert grid == (8, 32768) and args["BLOCKS"] == 2 and args["BLOCK"] == 32
    grid, args = tk._launch_args(buf[:4096], loc[:4096], spec, 128, tk.PoolPlan(32, 1))
    assert grid == (8, 128) and args["BLOCKS"] == 1


def _odd_nans(dtype: torch.dtype) -> torch.Tensor:
    """x[2, HEADS, 64] holding NaNs of every sign and payload a GPU could turn into its own."""
    x = torch.randn(2, HEADS, 64)
    bits = torch.tensor([0x7FC00000, 0xFFC00000 - 2**32, 0x7F800001, 0x7FFFFFFF], dtype=torch.int32)
    x[0, 0, :4] = bits.view(torch.float32)
    x[1, 2, 7] = -float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_16_bits_store_the_formats_nan(tk, dtype):
    """Every NaN is stored as fp16 0x7E00, in the reference and in the kernel."""
    x, spec, loc = _odd_nans(dtype), QuantSpec(16), torch.tensor([3, 0])
    rows = quantize(x, spec).view(torch.int16)
    assert rows[x.isnan()].eq(0x7E00).all() and rows[x.isnan()].numel() == 5
    buf = torch.zeros(4, HEADS, spec.row_bytes(64), dtype=torch.uint8)
    tk.triton_scatter_quantized(buf, loc, x, spec)
    assert torch.equal(buf[loc], quantize(x, spec))


def test_strided_x_is_read_in_place(tk):
    """K sliced out of a fused [N, 3*heads, D] projection: same bytes as a contiguous copy."""
    fused = torch.randn(5, 3 * HEADS, 64)
    k = fused[:, HEADS : 2 * HEADS]
    for spec in (QuantSpec(4, 32), QuantSpec(16), QuantSpec(4, 32, rotation="hadamard")):
        buf = torch.zeros(SLOTS, HEADS, spec.row_bytes(64), dtype=torch.uint8)
        tk.triton_scatter_quantized(buf, LOC, k, spec)
        assert torch.equal(buf[LOC], quantize(k.contiguous(), spec))


def test_non_contiguous_buffer_slots(tk):
    """A view with a padded slot stride (e.g. one layer of a bigger pool) works in place."""
    spec = QuantSpec(2, 32)
    pool = torch.zeros(2, 6, HEADS, spec.row_bytes(64), dtype=torch.uint8)
    layer = pool[1]
    x = torch.randn(2, HEADS, 64)
    tk.triton_scatter_quantized(layer, torch.tensor([4, 2]), x, spec)
    assert torch.equal(pool[1, [4, 2]], quantize(x, spec))
    assert not pool[0].any() and not pool[1, [0, 1, 3, 5]].any()


@pytest.mark.parametrize("bits", [3, 5, 6])
def test_rows_padded_to_16_bytes_read_part_filled_high_words_a_chunk_a_thread(tk, bits):
    """3/5/6-bit rows of D = 80 whose offsets are multiples of 16 bytes (rows padded as a pool
    may pad them): unpack reads them a chunk of 8 codes a thread (contiguous, their 50-80
    byte rows are only 2-byte aligned, and take the general read); at 3 and 5 bits the high
    plane's last word part-filled, its codes in channel order."""
    spec = QuantSpec(bits, 16)
    rows = spec.row_bytes(80)
    buf = torch.randint(0, 256, (SLOTS, HEADS, -(-rows // 16) * 16), dtype=torch.uint8)
    buf = buf[..., :rows]
    x = _inputs(80, torch.float32)
    tk.triton_scatter_quantized(buf, LOC, x, spec)
    out = tk.triton_gather_dequantized(buf, LOC, spec, 80, torch.float32)
    assert _same_values(out, dequantize(quantize(x, spec), spec, 80, torch.float32))


def _at_byte_offset(offset: int, *shape: int) -> torch.Tensor:
    """A uint8 buffer of ``shape`` whose data starts ``offset`` bytes into its storage."""
    return torch.zeros(offset + math.prod(shape), dtype=torch.uint8)[offset:].view(shape)


@pytest.mark.parametrize("offset", [1, 2, 4, 8])
def test_rows_at_any_byte_offset(tk, offset):
    """Rows move in units of the largest power of two their offsets share (136-byte KV8 g64
    rows: 8 bytes); a buffer that starts at an odd byte still gets the reference's bytes."""
    x = torch.randn(3, HEADS, 128)
    loc = torch.tensor([4, 0, 2])
    for spec in (QuantSpec(8, 64), QuantSpec(4, 32), QuantSpec(3, 32), QuantSpec(16)):
        buf = _at_byte_offset(offset, SLOTS, HEADS, spec.row_bytes(128))
        if offset == 1 and not spec.is_quantized:
            with pytest.raises(ValueError, match="even byte offsets"):
                tk.triton_scatter_quantized(buf, loc, x, spec)
            continue
        tk.triton_scatter_quantized(buf, loc, x, spec)
        assert torch.equal(buf[loc], quantize(x, spec))
        assert _same_values(
            tk.triton_gather_dequantized(buf, loc, spec, 128), dequantize(buf[loc], spec, 128)
        )
    rows = _at_byte_offset(offset, SLOTS, HEADS, 136)
    assert tk._row_align(rows, rows.stride(1)) == min(offset, 8)


def test_empty_loc_is_a_no_op(tk):
    spec = QuantSpec(4, 32)
    buf = torch.ones(4, HEADS, spec.row_bytes(64), dtype=torch.uint8)
    tk.triton_scatter_quantized(
        buf, torch.zeros(0, dtype=torch.long), torch.zeros(0, HEADS, 64), spec
    )
    assert buf.eq(1).all()
    assert tk.triton_gather_dequantized(buf, torch.zeros(0, dtype=torch.long), spec, 64).shape == (
        0,
        HEADS,
        64,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(buffer=torch.zeros(4, HEADS, 40, dtype=torch.int8)), "buffer must be uint8"),
        (dict(buffer=torch.zeros(4, HEADS, 41, dtype=torch.uint8)), "needs 40"),
        (dict(buffer=torch.zeros(4, HEADS, 80, dtype=torch.uint8)[..., ::2]), "contiguous rows"),
        (dict(loc=torch.tensor([[1, 2]])), "loc must be 1-D"),
        (dict(loc=torch.tensor([1.0, 2.0])), "loc must be 1-D int32/int64"),
        (dict(x=torch.zeros(2, HEADS, 64, dtype=torch.int32)), "x must be fp16/bf16/fp32"),
        (dict(x=torch.zeros(3, HEADS, 64)), "len\\(loc\\)=2"),
        (dict(x=torch.zeros(2, HEADS + 1, 64)), "heads=3"),
        (dict(spec=QuantSpec(4, 32, axis="channel")), "token-axis"),
    ],
)
def test_scatter_argument_checks(tk, change, message):
    args = dict(
        buffer=torch.zeros(4, HEADS, 40, dtype=torch.uint8),
        loc=torch.tensor([1, 2]),
        x=torch.zeros(2, HEADS, 64),
        spec=QuantSpec(4, 32),
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        tk.triton_scatter_quantized(args["buffer"], args["loc"], args["x"], args["spec"])


def test_gather_argument_checks(tk):
    buf = torch.zeros(4, HEADS, 40, dtype=torch.uint8)
    with pytest.raises(ValueError, match="needs 60"):
        tk.triton_gather_dequantized(buf, torch.tensor([1]), QuantSpec(4, 32), 96)
    with pytest.raises(ValueError, match="dtype must be"):
        tk.triton_gather_dequantized(buf, torch.tensor([1]), QuantSpec(4, 32), 64, torch.int32)


def test_kernels_refuse_cpu_tensors_without_the_interpreter():
    """Built for a GPU (no TRITON_INTERPRET), CPU tensors get a clear ValueError, not a crash."""
    code = textwrap.dedent("""
        import torch
        from kvtuner.quant import QuantSpec
        from kvtuner.quant.triton_kernels import interpreted, triton_scatter_quantized
        assert not interpreted()
        try:
            triton_scatter_quantized(torch.zeros(2, 1, 40, dtype=torch.uint8), torch.tensor([0]),
                                     torch.zeros(1, 1, 64), QuantSpec(4, 32))
        except ValueError as exc:
            print(exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "TRITON_INTERPRET=1" in res.stdout


GPU_COMPILE = textwrap.dedent("""
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kvtuner.quant import QuantSpec
    from kvtuner.quant import triton_kernels as tk

    def compile_ptx(kernel, pointers, args, strides=()):
        options = {"enable_fp_fusion": args.pop("enable_fp_fusion"),
                   "num_warps": args.pop("num_warps")}
        sig = {**pointers, "n_tokens": "i32", "stride_slot": "i64",
               "stride_head": "i64", **{k: "i64" for k in strides},
               **{k: "constexpr" for k in args if k.isupper()}}
        consts = {k: v for k, v in args.items() if k.isupper()}
        src = ASTSource(kernel, sig, consts)
        return triton.compile(src, target=GPUTarget("cuda", 80, 32), options=options).asm["ptx"]

    buf, loc = torch.zeros(8, 2, 40, dtype=torch.uint8), torch.arange(4)
    for spec in (QuantSpec(4, 32), QuantSpec(4, 32, True), QuantSpec(16), QuantSpec(3, 32),
                 QuantSpec(6, 16, True)):
        buf = torch.zeros(8, 2, spec.row_bytes(64), dtype=torch.uint8)
        _, args = tk._launch_args(buf, loc, spec, 64, tk.plan_pool(spec, pack=True))
        q = spec.is_quantized
        scatter = compile_ptx(tk._scatter_kernel if q else tk._scatter_fp16_kernel,
                              {"x_ptr": "*bf16", "loc_ptr": "*i64", "buf_ptr": "*u8"}, dict(args),
                              ("stride_xt", "stride_xh"))
        gather = compile_ptx(tk._gather_kernel if q else tk._gather_fp16_kernel,
                             {"buf_ptr": "*u8", "loc_ptr": "*i32", "out_ptr": "*i16"},
                             dict(args, OUT_BF16=True))
        gather_bf16 = compile_ptx(tk._gather_kernel if q else tk._gather_fp16_kernel,
                                  {"buf_ptr": "*u8", "loc_ptr": "*i32", "out_ptr": "*bf16"},
                                  dict(args, OUT_BF16=False))
        for ptx in (scatter, gather, gather_bf16):
            assert "fma.rn.f32" not in ptx, "FMA contraction changes rounding"
            assert "div.full.f32" not in ptx and "div.approx.f32" not in ptx
        print(spec.short(), "div.rn.f32" in scatter, "div.rn.f32" in gather)
    # Hadamard fused as fp32 butterflies: no FMA, no tensor-core (TF32) instructions
    spec = QuantSpec(4, 32, rotation="hadamard")
    buf = torch.zeros(8, 2, spec.row_bytes(64), dtype=torch.uint8)
    _, args = tk._launch_args(buf, loc, spec, 64, tk.plan_pool(spec, pack=True))
    scatter = compile_ptx(tk._scatter_kernel, {"x_ptr": "*bf16", "loc_ptr": "*i64",
                          "buf_ptr": "*u8"}, dict(args), ("stride_xt", "stride_xh"))
    gather = compile_ptx(tk._gather_kernel, {"buf_ptr": "*u8", "loc_ptr": "*i32",
                         "out_ptr": "*i16"}, dict(args, OUT_BF16=True))
    print(spec.short(), "mma" in scatter + gather, "fma.rn.f32" in scatter + gather)
""")


def test_kernels_compile_for_a_gpu_with_ieee_division_and_no_fma():
    """No GPU here: compile to PTX for sm_80 (Triton ships ptxas) and inspect the float ops that
    decide the bytes: IEEE division (div.rn: a group's 1 / scale), no FMA contraction, no
    approximate division."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", GPU_COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:6] == [
        "4b/g32/asym/token True False",  # asym gather multiplies and adds only
        "4b/g32/sym/token True True",
        "16b False False",
        "3b/g32/asym/token True False",  # codes in a low and a high plane
        "6b/g16/sym/token True True",
        "4b/g32/asym/token/had False False",  # no TF32 mma, no FMA for the rotation
    ]
