"""The decode kernel (:mod:`kvtuner.attention.decode_kernel`) against the torch reference under
Triton's interpreter, at head_dim 64: groups below head_dim (codes dequantized element-wise in
pair order) and one scale a token-head (scale and zero after the dot); which batches it serves
and which go to the general kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from test_decode import scattered_table, stored_rows

from kvtuner.attention import (
    AttentionBatch,
    choose_splits,
    decode_attention,
    decode_attention_reference,
    extend_attention,
    packed_rows,
)
from kvtuner.attention.decode_kernel import DecodePlan, launch_decode, plan_decode, serves
from kvtuner.attention.layout import programs_an_sm
from kvtuner.attention.packed_rows import decodable, dotted_groups, narrow_offsets
from kvtuner.quant import QuantSpec, quantize

D = 64
LENGTHS = [150, 1, 67]  # several tiles and splits, a length-1 request, a partial tile


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pool(k_spec, v_spec, lengths=LENGTHS, kv_heads=2, seed=0, dim=D):
    """(rows and specs, keywords) of a paged pool whose requests' slots are scattered."""
    g = gen(seed)
    slots = sum(lengths) + 8
    k = torch.randn(slots, kv_heads, dim, generator=g) * 2 + 0.5  # off-centre: zeros matter
    v = torch.randn(slots, kv_heads, dim, generator=g)
    table = scattered_table(lengths, slots, g)
    lens = torch.tensor(lengths, dtype=torch.int32)
    args = (quantize(k, k_spec), quantize(v, v_spec), k_spec, v_spec)
    return args, dict(lengths=lens, slot_table=table)


def check(q, args, kw, tol=2e-5, **launch):
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=args[0], v_rows=args[1], k_spec=args[2],
                           v_spec=args[3], **kw)  # fmt: skip
    assert serves(batch)  # the decode kernel, not the general one
    got = decode_attention(q, *args, **kw, **launch)
    torch.testing.assert_close(got, decode_attention_reference(q, *args, **kw), atol=tol, rtol=tol)
    return got


SPECS = [
    (QuantSpec(4), QuantSpec(4)),  # groups of 32: two a row
    (QuantSpec(2, group_size=16), QuantSpec(2, group_size=16, symmetric=True)),
    (QuantSpec(8), QuantSpec(8, group_size=32, symmetric=True)),
    (QuantSpec(4, group_size=8, symmetric=True), QuantSpec(4, group_size=64)),
    (QuantSpec(4, group_size=64), QuantSpec(4, group_size=64)),  # one scale a token-head
    (QuantSpec(8, group_size=64), QuantSpec(2, group_size=32)),
    (QuantSpec(16), QuantSpec(4)),
    (QuantSpec(4, group_size=64), QuantSpec(16)),
    (QuantSpec(3), QuantSpec(3, symmetric=True)),  # codes in two planes
    (QuantSpec(5, group_size=64, rotation="hadamard"), QuantSpec(6, group_size=16)),
    (QuantSpec(6, symmetric=True), QuantSpec(3, group_size=64)),
]


@pytest.mark.parametrize("k_spec,v_spec", SPECS, ids=lambda s: s.short())
@pytest.mark.parametrize("ratio", [1, 4])
def test_every_served_format_matches_the_reference(k_spec, v_spec, ratio):
    args, kw = pool(k_spec, v_spec)
    q = torch.randn(3, 2 * ratio, D, generator=gen(1)) * 2
    check(q, args, kw, block_tokens=16, num_splits=3)
    check(q, args, kw)  # the launcher's own plan


@pytest.mark.parametrize("rising", [True, False])
def test_the_accumulator_follows_a_rising_or_falling_row_max(rising):
    """Keys along q, their scores rising tile after tile (every tile's max grows: every tile
    rescales the accumulator by less than 1) or falling (only the first tile sets it: later
    tiles rescale by 1), at one and several splits: both match the reference."""
    spec = QuantSpec(4)
    q = torch.randn(2, 4, D, generator=gen(11))
    steps = torch.linspace(-3, 3, 150) if rising else torch.linspace(3, -3, 150)
    along = q[0, 0] / q[0, 0].norm()  # [D]: KV head 0's first query row
    slots = 310
    k = torch.randn(slots, 2, D, generator=gen(12)) * 0.1
    table = scattered_table([150, 150], slots, gen(13))
    k[table[0].long(), 0] += steps[:, None] * along * 4
    v = torch.randn(slots, 2, D, generator=gen(14))
    args = (quantize(k, spec), quantize(v, spec), spec, spec)
    kw = dict(lengths=torch.tensor([150, 150], dtype=torch.int32), slot_table=table)
    for splits in (1, 3):
        check(q, args, kw, block_tokens=16, num_splits=splits)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_hf_rows_with_a_tail_left_padding_a_window_and_sinks(rotation):
    k_spec = QuantSpec(4, rotation=rotation)
    v_spec = QuantSpec(8, group_size=64, rotation=rotation)
    g = gen(2)
    k, v = (torch.randn(2, 2, 90, D, generator=g) for _ in range(2))
    args = (quantize(k[:, :, :70], k_spec), quantize(v[:, :, :70], v_spec), k_spec, v_spec)
    kw = dict(k_tail=k[:, :, 70:], v_tail=v[:, :, 70:], starts=torch.tensor([0, 75]).int())
    q = torch.randn(2, 8, D, generator=g)
    check(q, args, kw, block_tokens=16, num_splits=2)
    extra = dict(window=30, logit_cap=2.0, sinks=torch.randn(8, generator=g))
    check(q, args, {**kw, **extra}, block_tokens=16, num_splits=2)


@pytest.mark.parametrize("spec", [QuantSpec(4), QuantSpec(8, group_size=64)], ids=QuantSpec.short)
def test_left_padding_rows_stay_unread_so_nan_there_never_reaches_a_result(spec):
    """HF rows [B, Hkv, T, R] with left padding: tiles start at a request's first real row,
    so padding rows whose metadata is NaN (scales and zeros are read unmasked) change
    nothing; a start past the packed rows leaves only the tail."""
    g = gen(4)
    k, v = (torch.randn(3, 2, 90, D, generator=g) for _ in range(2))
    args = (quantize(k[:, :, :70], spec), quantize(v[:, :, :70], spec), spec, spec)
    kw = dict(k_tail=k[:, :, 70:], v_tail=v[:, :, 70:], starts=torch.tensor([0, 37, 75]).int())
    q = torch.randn(3, 4, D, generator=g)
    clean = check(q, args, kw, block_tokens=16, num_splits=2)
    for rows in args[:2]:
        rows[1, :, :37] = 0xFF  # request 1's padding: NaN scales and zeros
        rows[2] = 0xFF  # request 2 pads past its packed rows
    assert torch.equal(decode_attention(q, *args, **kw, block_tokens=16, num_splits=2), clean)


@pytest.mark.parametrize(
    "v_spec",
    [
        QuantSpec(4),
        QuantSpec(8, group_size=64),
        QuantSpec(2, group_size=32, symmetric=True),
        QuantSpec(4, group_size=128),
    ],
    ids=QuantSpec.short,
)
def test_value_tiles_in_the_mma_lane_order_at_head_dim_128(v_spec):
    """Decode reads value tiles in the MMA's lane order (:func:`value_lanes`): at head_dim 128
    a lane dequantizes 1, 2 or 4 words of each row (2, 4, 8 bits) with its own group's scale
    and zero, or takes the raw codes of a row of one scale (scaled after the dot), and the
    result comes back to channel order once; at head_dim 64 (the tests above) 2-bit rows keep
    pair order."""
    args, kw = pool(QuantSpec(4), v_spec, lengths=[100, 40], dim=128)
    q = torch.randn(2, 8, 128, generator=gen(5))
    check(q, args, kw, block_tokens=16, num_splits=2)
    check(q, args, kw)


FP16_SPECS = [s for s in SPECS if "hadamard" not in (s[0].rotation, s[1].rotation)]


@pytest.mark.parametrize("k_spec,v_spec", FP16_SPECS, ids=lambda s: s.short())
@pytest.mark.parametrize("ratio", [1, 8])
def test_the_gpus_fp16_dots_match_the_reference_under_the_interpreter(k_spec, v_spec, ratio):
    """On a GPU q reaches the kernel in 16 bits and the dots run in fp16: codes become fp16 by
    the exponent trick, keys dotted first with the heads as the MMA's 8 columns (1 and 8
    heads a KV head here). The launcher hands the interpreter fp32 queries; fp16 ones given to
    :func:`launch_decode` itself run that GPU path on the CPU (hadamard keys aside: their q
    is rotated by the caller)."""
    args, kw = pool(k_spec, v_spec)
    q = torch.randn(3, 2 * ratio, D, generator=gen(1)) * 2
    batch = AttentionBatch(q=q.half().unsqueeze(1), k_rows=args[0], v_rows=args[1],
                           k_spec=k_spec, v_spec=v_spec, **kw)  # fmt: skip
    assert serves(batch)
    got = launch_decode(batch, batch.q, None, None, plan_decode(batch)).squeeze(1)
    want = decode_attention_reference(q.half().float(), *args, **kw)
    torch.testing.assert_close(got, want, atol=1.5e-2, rtol=1.5e-2)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_one_scale_a_token_head_dots_top_codes_and_keys_in_lane_order(bits):
    """Rows of one scale a token-head dot their raw codes and scale after the dot. On the GPU's
    fp16 path the codes are read as 1 + c/2**bits (the top of the mantissa, no subtraction of
    the exponent trick's 1024; 8 bits: 1024 + c, no shift) and the 1 (1024) comes off in fp32
    (·Σq for keys, ·Σ p·s for values);
    one-warp keys are dotted in key lane order, q put in it once. At head_dim 128 each lane of
    an MMA quad reads 32 channels of whole words (16 bytes a row at 4 bits). Within 1e-3 of
    the reference, as the codes less 1024 were (6.6e-4 at most here); 1024 + c dotted and the
    1024 taken off after missed it by up to 3e-3 at 2 bits (checked)."""
    spec = QuantSpec(bits, group_size=128)
    args, kw = pool(spec, spec, lengths=[100, 40], dim=128)
    q = torch.randn(2, 8, 128, generator=gen(4)) * 2
    batch = AttentionBatch(q=q.half().unsqueeze(1), k_rows=args[0], v_rows=args[1],
                           k_spec=spec, v_spec=spec, **kw)  # fmt: skip
    plan = plan_decode(batch)
    assert serves(batch) and plan.num_warps == 1
    got = launch_decode(batch, batch.q, None, None, plan).squeeze(1)
    want = decode_attention_reference(q.half().float(), *args, **kw)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)


TWO_GROUPS = [  # head_dim 128, groups of 64; the dots a row of keys and values take
    (QuantSpec(8, group_size=64), QuantSpec(8, group_size=64), (2, 2)),
    (QuantSpec(4, group_size=64), QuantSpec(4, group_size=64, symmetric=True), (2, 2)),
    (QuantSpec(3, group_size=64), QuantSpec(6, group_size=64), (2, 2)),  # planes, spans at 64
    (QuantSpec(8, group_size=64), QuantSpec(16), (2, 0)),
    (QuantSpec(16), QuantSpec(8, group_size=64), (0, 2)),
    (QuantSpec(8, group_size=64), QuantSpec(4, group_size=128), (2, 1)),
    (QuantSpec(4, group_size=64), QuantSpec(4), (0, 0)),  # beside g32 values, dequantized
]


@pytest.mark.parametrize(
    "k_spec,v_spec,dots", TWO_GROUPS, ids=lambda x: getattr(x, "short", x.__str__)()
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_rows_two_groups_are_dotted_apart_on_one_warp(k_spec, v_spec, dots, dtype):
    """At head_dim 128 a row of two groups of 64 meets q (and p) in two dots of raw codes, one
    a group, its scale and zero applied after the dot in fp32 (``dotted_groups`` 2: keys in
    key lane order a group, values in value lane order a group, the zeros' part summed a
    group); on the GPU's fp16 path (fp16 q under the interpreter) the codes are 1 + c/2**bits.
    Within 2e-5 of the reference for fp32 q and 3e-3 for fp16 (the element-wise fp16 path
    this replaces was up to 5.4e-3 off on these rows; now 2e-3 with symmetric values, 5.5e-4
    without; the last row, dequantized element-wise, 2.9e-3); the two groups' scales swapped
    in the scores, or their zero sums in the values, fail here (checked)."""
    args, kw = pool(k_spec, v_spec, lengths=[100, 40, 1], dim=128)
    q = (torch.randn(3, 8, 128, generator=gen(5)) * 2).to(dtype)
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=args[0], v_rows=args[1], k_spec=k_spec,
                           v_spec=v_spec, **kw)  # fmt: skip
    plan = plan_decode(batch)
    assert serves(batch) and plan.num_warps == 1
    v_dots = dotted_groups(v_spec.bits, v_spec.group_size, 128, True)
    elementwise = v_spec.bits < 16 and not v_dots
    assert (dotted_groups(k_spec.bits, k_spec.group_size, 128, True, elementwise), v_dots) == dots
    got = launch_decode(batch, batch.q, None, None, plan).squeeze(1).float()
    want = decode_attention_reference(q.float(), *args, **kw)
    tol = 2e-5 if dtype == torch.float32 else 3e-3
    torch.testing.assert_close(got, want, atol=tol, rtol=tol if dtype == torch.float32 else 0)


@triton.jit
def _lane_order_kernel(out_ptr, D: tl.constexpr):
    x = tl.arange(0, 2 * D).reshape(2, D)
    tl.store(out_ptr + tl.arange(0, 2 * D).reshape(2, D), packed_rows.key_lanes(x))


@pytest.mark.parametrize("k_width", [2, 4])
def test_key_lane_order_gives_each_lane_runs_of_the_operands_width(k_width, monkeypatch):
    """Position k of a row in key lane order holds pair-order position (D/4)·t + K·r + i, for k =
    4K·r + K·t + i (lane t of an MMA quad, runs of K = the key operand's kWidth): each lane
    reads a quarter of the row's words, whichever width the building Triton takes."""
    monkeypatch.setattr(packed_rows, "K_WIDTH", tl.constexpr(k_width))
    out = torch.empty(2, 128, dtype=torch.int32)
    _lane_order_kernel[(1,)](out, 128)
    k = torch.arange(128)
    r, t, i = k // (4 * k_width), k // k_width % 4, k % k_width
    want = 32 * t + k_width * r + i
    assert torch.equal(out, torch.stack([want, want + 128]).int())


LANE_ORDERED = [  # head_dim 128: keys dequantized in key lane order, or raw codes dotted in it
    (QuantSpec(4), QuantSpec(4)),
    (QuantSpec(2), QuantSpec(2)),
    (QuantSpec(4, symmetric=True), QuantSpec(4)),
    (QuantSpec(8, group_size=64), QuantSpec(4)),
    (QuantSpec(4, group_size=128), QuantSpec(4, group_size=128)),
    (QuantSpec(3), QuantSpec(3)),  # two planes: a lane's quarter is whole words of both
    (QuantSpec(5, group_size=64), QuantSpec(3)),
    (QuantSpec(6), QuantSpec(2)),
]


@pytest.mark.parametrize("k_spec,v_spec", LANE_ORDERED, ids=lambda s: s.short())
@pytest.mark.parametrize("k_width", [2, 4])
def test_keys_in_lane_order_at_either_operand_width_match_the_reference(
    k_spec, v_spec, k_width, monkeypatch
):
    """Keys and q in key lane order for a key operand of kWidth 2 (Triton 3.9's build) or 4
    (3.6's, the GPU machines'); fp16 q takes the GPU's path, its 2/4-bit keys read in place in
    their byte (``IN_BYTE``: 1024 + 2**m·c, one fp16 fma to c). Within 2e-5 of the reference
    for fp32 q and 1e-2 for fp16 (6.2e-6 and 5.4e-3 at most here, the same at both widths);
    that fma's 2**-m left at 1 for every pair, or q in the order of width 2 beside keys in
    width 4, put results 4.4-5.2 off (checked)."""
    monkeypatch.setattr(packed_rows, "K_WIDTH", tl.constexpr(k_width))
    args, kw = pool(k_spec, v_spec, lengths=[100, 40, 1], dim=128)
    q = torch.randn(3, 8, 128, generator=gen(9)) * 2
    for dtype, tol in ((torch.float32, 2e-5), (torch.float16, 1e-2)):
        batch = AttentionBatch(q=q.to(dtype).unsqueeze(1), k_rows=args[0], v_rows=args[1],
                               k_spec=k_spec, v_spec=v_spec, **kw)  # fmt: skip
        plan = plan_decode(batch)
        assert serves(batch) and plan.num_warps == 1
        got = launch_decode(batch, batch.q, None, None, plan).squeeze(1).float()
        want = decode_attention_reference(q.to(dtype).float(), *args, **kw)
        torch.testing.assert_close(got, want, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "v_spec",
    [QuantSpec(4), QuantSpec(4, symmetric=True), QuantSpec(4, group_size=D)],
    ids=lambda s: s.short(),
)
def test_folded_value_codes_stay_within_an_ulp_of_the_folded_zero(v_spec):
    """The GPU's fp16 path reads 4-bit value codes as 1 + c/16 and folds the 1 into the zero
    (``row_codes``' ``TOP``): a one-token request's output is its value row, each element off
    the reference by at most the folded zero's rounding (half an fp16 ulp of |z| + 16·s, below
    max|x| + 1.2·range of its group) and its own; one scale a token-head folds after the dot, in
    fp32. With the exponent trick's 1024 folded instead, groups below head_dim round the zero
    by up to half a step (~range/30) and fail here (checked)."""
    args, kw = pool(QuantSpec(16), v_spec, lengths=[1, 1, 1])
    q = torch.randn(3, 4, D, generator=gen(2))
    batch = AttentionBatch(q=q.half().unsqueeze(1), k_rows=args[0], v_rows=args[1],
                           k_spec=QuantSpec(16), v_spec=v_spec, **kw)  # fmt: skip
    got = launch_decode(batch, batch.q, None, None, plan_decode(batch)).squeeze(1).float()
    want = decode_attention_reference(q.half().float(), *args, **kw)  # [3, 4, D]: value rows
    groups = want.unflatten(-1, (-1, v_spec.group_size))
    width = groups.amax(-1, keepdim=True) - groups.amin(-1, keepdim=True)
    span = groups.abs().amax(-1, keepdim=True) + 1.2 * width
    bound = (span.expand_as(groups).flatten(-2) + want.abs()) * 2.0**-10
    assert ((got - want).abs() <= bound).all()


def test_rows_of_68_bytes_load_words_and_nan_rows_outside_the_window_stay_unread():
    """KV4 at one scale a token-head of 128 channels: 68-byte rows (4-byte loads, VEC 1)."""
    spec = QuantSpec(4, group_size=128)
    args, kw = pool(spec, spec, lengths=[100, 40], dim=128)
    assert args[0].shape[-1] == 68
    kw["window"] = 50
    q = torch.randn(2, 4, 128, generator=gen(3))
    clean = check(q, args, kw, block_tokens=16, num_splits=2)
    for rows in args[:2]:  # NaN metadata on request 0's first 40 tokens, outside its window
        rows[kw["slot_table"][0, :40].long()] = 0xFF
    assert torch.equal(decode_attention(q, *args, **kw, block_tokens=16, num_splits=2), clean)


def test_what_the_decode_kernel_leaves_to_the_general_one():
    def batch(k_spec, v_spec=None, **kw):
        v_spec = v_spec or QuantSpec(4)
        args, index = pool(k_spec, v_spec)
        q = torch.randn(3, 1, 4, D)
        return AttentionBatch(q=q, k_rows=args[0], v_rows=args[1], k_spec=k_spec, v_spec=v_spec,
                              **{**index, **kw})  # fmt: skip

    assert serves(batch(QuantSpec(4)))
    assert serves(batch(QuantSpec(3)))  # two planes: whole high-plane words of 32 channels
    assert not serves(batch(QuantSpec(2, group_size=8)))  # a word of 16 codes spans 2 groups
    assert serves(batch(QuantSpec(4), QuantSpec(6)))
    assert not decodable(QuantSpec(3, group_size=16), 16)  # half a high-plane word
    assert not decodable(QuantSpec(4, axis="channel"), 64)  # KIVI keys
    assert not serves(batch(QuantSpec(8, group_size=64, symmetric=True)))  # 66-byte rows
    rope = QuantSpec(4, pre_rope=True)
    assert serves(batch(rope, rope_freq=torch.ones(D // 2)))  # rotated a span at a time
    assert not serves(batch(rope, rope_freq=torch.ones(4)))  # R = 8: halves under a dot's 16
    args, index = pool(QuantSpec(4), QuantSpec(4))
    two = AttentionBatch(q=torch.randn(3, 2, 4, D), k_rows=args[0], v_rows=args[1],
                         k_spec=args[2], v_spec=args[3], **index)  # fmt: skip
    assert not serves(two)  # two query tokens: extend
    with pytest.raises(ValueError, match="general kernel"):
        launch_decode(two, two.q, None, None, DecodePlan(1))


def test_unaligned_rows_fall_back_to_the_general_kernel_with_the_same_result():
    spec = QuantSpec(4)
    args, kw = pool(spec, spec)
    raw = torch.zeros(args[0].numel() + 2, dtype=torch.uint8)
    odd = raw[2:].view(args[0].shape)  # 2 bytes past a word: no int32 view
    odd.copy_(args[0])
    q = torch.randn(3, 4, D, generator=gen(4))
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=odd, v_rows=args[1], k_spec=spec,
                           v_spec=spec, **kw)  # fmt: skip
    assert not serves(batch)
    got = decode_attention(q, odd, *args[1:], **kw)
    torch.testing.assert_close(got, decode_attention_reference(q, *args, **kw))


def test_plans_fill_the_device_and_reject_bad_tiles():
    args, kw = pool(QuantSpec(4), QuantSpec(4))
    batch = AttentionBatch(q=torch.randn(3, 1, 4, D), k_rows=args[0], v_rows=args[1],
                           k_spec=args[2], v_spec=args[3], **kw)  # fmt: skip
    assert plan_decode(batch).splits <= 2  # the interpreter: at most 2
    assert plan_decode(batch, sms=132).splits == 1  # 150 tokens: one split of >= 256
    bad_plans = (dict(splits=0), dict(splits=1, block_tokens=24), dict(splits=1, num_warps=3),
                 dict(splits=1, max_registers=40), dict(splits=1, max_registers=256))  # fmt: skip
    for bad in bad_plans:
        with pytest.raises(ValueError):
            DecodePlan(**bad)


def test_a_register_cap_reaches_the_decode_kernel_and_no_other():
    """``max_registers`` (ptxas' maxnreg, a tile sweep's knob) leaves the result as it was; a
    batch for another kernel (here: two query tokens a request) refuses it."""
    args, kw = pool(QuantSpec(4), QuantSpec(4))
    q = torch.randn(3, 4, D, generator=gen(15))
    capped = check(q, args, kw, max_registers=168)
    assert torch.equal(capped, decode_attention(q, *args, **kw))
    two = torch.randn(3, 2, 4, D, generator=gen(16))
    with pytest.raises(ValueError, match="max_registers"):
        extend_attention(two, *args, **kw, max_registers=168)


def far_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` copied to the start of a storage 8 GiB longer (allocated, never touched)."""
    size = rows.numel()
    storage = torch.empty(size + (1 << 33), dtype=torch.uint8)
    return storage[:size].view(rows.shape).copy_(rows)


def test_rows_reaching_past_8_gib_take_int64_offsets_with_the_same_result():
    """The decode and extend kernels take row offsets in int32 where each side's rows reach
    under 8 GiB past their first byte (:func:`narrow_offsets`), else in int64: the same rows
    at the start of a longer storage give the same results to the bit."""
    args, kw = pool(QuantSpec(4), QuantSpec(8, group_size=32))
    far = (far_rows(args[0]), far_rows(args[1]), *args[2:])
    q = torch.randn(3, 4, D, generator=gen(21))
    for rows, narrow in ((args, True), (far, False)):
        batch = AttentionBatch(q=q.unsqueeze(1), k_rows=rows[0], v_rows=rows[1],
                               k_spec=rows[2], v_spec=rows[3], **kw)  # fmt: skip
        assert narrow_offsets(batch) is narrow
    assert torch.equal(check(q, far, kw), check(q, args, kw))
    two = torch.randn(3, 2, 4, D, generator=gen(22))
    assert torch.equal(extend_attention(two, *far, **kw), extend_attention(two, *args, **kw))


def test_plans_follow_the_row_alignment_and_the_rotary_width():
    """Keys stored after RoPE (pool rows, the HF cache's with a tail, KIVI pages) and pre-RoPE
    keys in token rows: 32 tokens on one warp, 2 stages, at any row (the H200's fastest,
    2026-11-26; the rest by the sm_90a build: keys rotated over the whole row since a tile's
    keys turn by a table), 3-bit keys too; but 8-bit keys in groups of 64 rotated over the
    whole row 16 (on 32, 24 bytes spilled under Triton 3.9); pre-RoPE 4-bit keys with an HF
    tail 64 tokens on 4 warps; KIVI pages of 3-bit codes one warp as well."""
    spec, rope = QuantSpec(4, 16), QuantSpec(4, 16, pre_rope=True)
    sym, sym_rope = QuantSpec(4, 8, symmetric=True), QuantSpec(4, 8, symmetric=True, pre_rope=True)

    def plan(k_spec, v_spec=spec, rotary=0):
        args, kw = pool(k_spec, v_spec)
        freq = torch.ones(rotary // 2) if rotary else None
        batch = AttentionBatch(q=torch.randn(3, 1, 4, D), k_rows=args[0], v_rows=args[1],
                               k_spec=k_spec, v_spec=v_spec, rope_freq=freq, **kw)  # fmt: skip
        p = plan_decode(batch)
        return p.block_tokens, p.num_warps, p.num_stages

    for k_spec, v_spec in ((spec, spec), (spec, QuantSpec(4)), (QuantSpec(16), QuantSpec(8, 16)),
                           (sym, sym), (QuantSpec(3), QuantSpec(3))):  # fmt: skip
        assert plan(k_spec, v_spec) == (32, 1, 2), (k_spec, v_spec)
    for k_spec, v_spec in ((rope, spec), (sym_rope, sym)):
        for rotary in (D, D // 2, D // 4):
            assert plan(k_spec, v_spec, rotary=rotary) == (32, 1, 2), (k_spec, rotary)
    assert plan(QuantSpec(3, pre_rope=True), QuantSpec(3), rotary=D) == (32, 1, 2)
    assert plan(QuantSpec(8, 64, pre_rope=True), QuantSpec(8, 64), rotary=D) == (16, 1, 2)
    assert plan(QuantSpec(8, 32, pre_rope=True), QuantSpec(8), rotary=D) == (32, 1, 2)
    args, tails = stored_rows(rope, spec, 40, 40, 48)  # the HF cache's, head_dim 32
    hf = AttentionBatch(q=torch.randn(2, 1, 4, 32), k_rows=args[0], v_rows=args[1], k_spec=rope,
                        v_spec=spec, rope_freq=torch.ones(16), **tails)  # fmt: skip
    assert dataclasses.astuple(plan_decode(hf))[1:4] == (64, 4, 2)


def test_splits_fill_two_whole_waves_of_one_warp_programs_or_4_an_sm_of_more():
    """16 requests × 8 KV heads × 32k tokens on 132 SMs: 16 splits of one warp (2048
    programs: 1.15× bf16 SDPA on the H200, where 17 ran 0.96× and 4 ran 0.85×), 5 of 4-8
    warps; 64 requests: 4 (1.16× at 8k, 5 ran 1.05×); never under 256 tokens a split."""
    cpu = torch.device("cpu")
    assert choose_splits(16, 8, 32768, cpu, sms=132, num_warps=1) == 16
    assert choose_splits(64, 8, 8192, cpu, sms=132, num_warps=1) == 4
    assert choose_splits(16, 8, 32768, cpu, sms=132, num_warps=4) == 5
    assert choose_splits(16, 8, 32768, cpu, sms=132, num_warps=8) == 5
    assert choose_splits(16, 8, 1024, cpu, sms=132, num_warps=1) == 4
    assert choose_splits(4096, 8, 8192, cpu, sms=132, num_warps=1) == 1


def test_one_warp_splits_follow_the_programs_an_sm_the_build_holds():
    """Value tiles in lane order took the one-warp KV4 g32 build from 245 to 182 registers
    (sm_90a): 11 programs an SM, not 8, so two whole waves are 22 splits at 16 × 8 KV heads
    (16 would fill 1.45 waves) and 5 at 64 × 8; the count is Hopper's register and
    shared-memory arithmetic, as sm90_report and Nsight Compute give it."""
    cpu = torch.device("cpu")
    assert choose_splits(16, 8, 32768, cpu, sms=132, num_warps=1, programs_an_sm=11) == 22
    assert choose_splits(64, 8, 8192, cpu, sms=132, num_warps=1, programs_an_sm=11) == 5
    assert choose_splits(16, 8, 32768, cpu, sms=132, num_warps=4, programs_an_sm=11) == 5
    assert programs_an_sm(182, 9984, 1) == 11 and programs_an_sm(245, 9728, 1) == 8
    assert programs_an_sm(196, 11264, 1) == 10 and programs_an_sm(168, 8704, 1) == 12
    assert programs_an_sm(154, 30000, 4) == 3  # 4 warps: registers
    assert programs_an_sm(64, 120000, 1) == 1  # shared memory
    assert programs_an_sm(32, 0, 1) == 32  # at most 32 programs
