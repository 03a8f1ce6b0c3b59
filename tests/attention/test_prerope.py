"""Pre-RoPE keys (rope_freq, rope_offset): the fused kernels rotate each dequantized K tile
(packed rows, channel blocks, tail) forward to its positions, as the torch reference does with
the HF cache's KeyRope semantics; under TRITON_INTERPRET, both kernel variants. The decode
kernel takes token-axis rows whose rotary halves are whole words or chunks (:mod:`kvtuner.
attention.rope_rows`), the general kernel the rest."""

from __future__ import annotations

import pytest
import torch
from test_channel_pages import LENGTHS, G, args, pool
from test_decode import D, both, gen, pool_args, stored_rows
from test_decode_kernel import check
from test_decode_kernel import pool as token_pool

from kvtuner.attention import AttentionBatch, decode_attention, decode_attention_reference
from kvtuner.attention.decode_kernel import plan_decode, serves
from kvtuner.attention.rope import rope_forward, rotary_steps
from kvtuner.attention.rope_rows import rope_steps
from kvtuner.quant import QuantSpec, quantize
from kvtuner.runtime_loader.hf.rope import KeyRope

pytestmark = pytest.mark.usefixtures("attention_variant")  # K tiles element-wise in both

FULL = torch.tensor([1.0, 0.6, 0.3, 0.1, 0.05, 0.02, 0.01, 0.003] * 2)  # R = 32 = D
PARTIAL = torch.tensor([1.0, 0.4, 0.1, 0.01])  # R = 8 < D: channels 8.. pass


def test_reference_rotation_is_the_caches_keyrope():
    x = torch.randn(2, 3, 9, D, generator=gen(20))
    for freq in (FULL, PARTIAL):
        want = KeyRope(freq).rotate(x, 11, forward=True)
        torch.testing.assert_close(rope_forward(x, freq, 11), want, atol=0, rtol=0)


@pytest.mark.parametrize(
    "k_spec,freq,ratio",
    [
        (QuantSpec(4, group_size=16), FULL, 2),  # scale-after-dot would take these rows
        (QuantSpec(3), PARTIAL, 4),
        (QuantSpec(16), PARTIAL, 1),
        (QuantSpec(2, group_size=16, axis="channel"), FULL, 2),  # KIVI blocks + own tail
        (QuantSpec(4, group_size=8, axis="channel", symmetric=True), PARTIAL, 4),
    ],
    ids=lambda x: x.short() if isinstance(x, QuantSpec) else str(x),
)
def test_rows_and_tail_rotated_at_an_offset(k_spec, freq, ratio):
    """The HF cache's layout: K rows or blocks + tail, one offset (a window's dropped tokens)
    for the batch, left padding; decode and extend."""
    args, tails = stored_rows(k_spec, QuantSpec(4), 32, 37, 41, bsz=2)
    q = torch.randn(2, 2 * ratio, D, generator=gen(21))
    rope = dict(rope_freq=freq, rope_offset=13, block_tokens=16, num_splits=2)
    starts = torch.tensor([0, 5], dtype=torch.int32)
    got, _ = both(q, *args, **tails, **rope, starts=starts)
    plain = decode_attention_reference(q, *args, **tails, starts=starts)
    assert not torch.allclose(got, plain, atol=1e-2)  # the rotation matters
    qx = torch.randn(2, 5, 2 * ratio, D, generator=gen(22))  # the last 5 tokens, causal
    both(qx, *args, **tails, **rope)


def test_paged_pool_with_an_offset_per_request():
    spec = QuantSpec(4, group_size=16)
    args, index = pool_args([70, 1, 37], 2, spec, spec)
    q = torch.randn(3, 4, D, generator=gen(23))
    offsets = torch.tensor([0, 1000, 45], dtype=torch.int32)
    both(q, *args, **index, rope_freq=FULL, rope_offset=offsets, block_tokens=16)


def test_offset_zero_and_position_zero_keys_are_the_plain_keys():
    """Rotating by position 0 is the identity: only the first key sits there."""
    spec = QuantSpec(4)
    args, tails = stored_rows(spec, spec, 0, 0, 1)  # one key, in the tail
    q = torch.randn(2, 4, D, generator=gen(24))
    got = decode_attention(q, *args, **tails, rope_freq=FULL)
    torch.testing.assert_close(got, decode_attention(q, *args, **tails), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(rope_freq=FULL.double()), "rope_freq must be contiguous fp32"),
        (dict(rope_freq=torch.ones(D)), "R <= head_dim"),
        (dict(rope_freq=FULL[::2]), "contiguous"),
        (dict(rope_freq=FULL.to("meta")), "on cpu"),
        (dict(rope_freq=None), "rope_offset needs rope_freq"),
        (dict(rope_offset=torch.zeros(3, dtype=torch.int32)), r"int32 \[2\]"),
        (dict(rope_offset=-1), "int >= 0"),
        (dict(rope_freq=torch.ones(6)), "power-of-two rotary width"),
        (dict(k_spec=QuantSpec(4, rotation="hadamard")), "neither Hadamard-rotated"),
    ],
)
def test_rope_arguments_are_checked_with_one_line(change, match):
    kw = dict(rope_freq=FULL, rope_offset=3) | change
    args, tails = stored_rows(kw.pop("k_spec", QuantSpec(4)), QuantSpec(4), 16, 16, 18)
    q = torch.randn(2, 4, D, generator=gen(25))
    with pytest.raises(ValueError, match=match) as info:
        decode_attention(q, *args, **tails, **kw)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("freq,decode_kernel", [(FULL, True), (PARTIAL, False)], ids=["R32", "R8"])
def test_paged_channel_pages_full_and_staged(freq, decode_kernel):
    """A pool's KIVI key pages: full pages' blocks and filling pages' staged fp values, both
    pre-RoPE, rotated alike (R = 32: the decode kernel, a page's spans a tile; R = 8: the
    general kernel)."""
    k_spec, v_spec = QuantSpec(4, group_size=G, axis="channel"), QuantSpec(4)
    rows, index = args(*pool(k_spec, v_spec), k_spec, v_spec)
    q = torch.randn(len(LENGTHS), 4, D, generator=gen(26))
    offsets = torch.tensor([2, 0, 7, 300], dtype=torch.int32)
    rope = dict(rope_freq=freq, rope_offset=offsets)
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=rows[0], v_rows=rows[1], k_spec=k_spec,
                           v_spec=v_spec, **index, **rope)  # fmt: skip
    assert serves(batch) == decode_kernel
    both(q, *rows, **index, **rope, block_tokens=16)
    both(q, *rows, **index, **rope)  # the launchers' own plans


@pytest.mark.parametrize("page", [32, 64])
def test_kivi_pages_turn_by_the_table_on_the_plans_32_key_tiles(page):
    """4-bit KIVI pages of 32 or 64 slots rotated over the whole row: the plan's tiles are 32
    keys of a page, which turn by the launch's rotary steps (full pages and the filling one)."""
    k_spec, v_spec = QuantSpec(4, group_size=page, axis="channel"), QuantSpec(4)
    rows, index = args(*pool(k_spec, v_spec, page=page), k_spec, v_spec)
    q = torch.randn(len(LENGTHS), 4, D, generator=gen(27))
    rope = dict(rope_freq=FULL, rope_offset=torch.tensor([2, 0, 7, 300], dtype=torch.int32))
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=rows[0], v_rows=rows[1], k_spec=k_spec,
                           v_spec=v_spec, **index, **rope)  # fmt: skip
    assert serves(batch) and plan_decode(batch).block_tokens == 32
    assert rope_steps(batch, 32, q.dtype) is not None and rope_steps(batch, 16, q.dtype) is None
    both(q, *rows, **index, **rope)


def llama_freq(half: int) -> torch.Tensor:
    """Llama's ``inv_freq`` for ``2 * half`` rotary channels (base 10000)."""
    return 1.0 / 10000 ** (torch.arange(half, dtype=torch.float32) / half)


OFFSETS = torch.tensor([0, 1000, 45], dtype=torch.int32)  # per request: pool tokens dropped


def test_rotary_steps_are_a_tiles_turns_in_the_codes_order_kept_per_frequencies():
    """The decode kernel's table of how far key i of a tile turns past its first key: cos and
    sin of i·f_j, columns in the 4-bit codes' pair order (place 8w + 2j + h holds channel 8w +
    j + 4h), kept while the frequencies are unchanged and rebuilt once they are written to."""
    freq = llama_freq(32)
    steps = rotary_steps(freq, 16, 8, torch.float32)
    order = [c - c % 8 + c % 8 // 2 + (c % 2) * 4 for c in range(32)]
    angle = torch.arange(16, dtype=torch.float32)[:, None] * freq[order]
    assert steps.shape == (16, 2, 32) and steps.is_contiguous()
    torch.testing.assert_close(steps[:, 0], angle.cos(), rtol=0, atol=0)
    torch.testing.assert_close(steps[:, 1], angle.sin(), rtol=0, atol=0)
    assert rotary_steps(freq, 16, 8, torch.float32) is steps
    plain = rotary_steps(freq, 16, 0, torch.float16)  # 16-bit keys: channel order
    assert plain.dtype == torch.float16
    torch.testing.assert_close(plain[3, 1], (3 * freq).sin().half())
    freq.mul_(2)
    again = rotary_steps(freq, 16, 8, torch.float32)
    assert again is not steps
    torch.testing.assert_close(again[:, 0], (2 * angle).cos())


@pytest.mark.parametrize(
    "k_spec,v_spec,rotary,dim",
    [
        (QuantSpec(4, pre_rope=True), QuantSpec(4), 64, 64),  # KV4 g32: halves of 4 words
        (QuantSpec(8, 64, pre_rope=True), QuantSpec(8, 64), 64, 64),  # one group a row
        (QuantSpec(8, 64, pre_rope=True), QuantSpec(4), 32, 64),  # K8V4, R = D/2
        (QuantSpec(2, 16, symmetric=True, pre_rope=True), QuantSpec(2, 16), 32, 64),
        (QuantSpec(3, pre_rope=True), QuantSpec(3, symmetric=True), 64, 64),  # high words of 32
        (QuantSpec(16), QuantSpec(4), 32, 64),
        (QuantSpec(4, pre_rope=True), QuantSpec(4), 32, 128),  # R = D/4: the whole row passes
    ],
    ids=lambda x: x.short() if isinstance(x, QuantSpec) else str(x),
)
@pytest.mark.parametrize("ratio", [1, 4])  # query heads a KV head
def test_the_decode_kernel_rotates_pool_keys_per_request(k_spec, v_spec, rotary, dim, ratio):
    args, kw = token_pool(k_spec, v_spec, dim=dim)
    q = torch.randn(3, 2 * ratio, dim, generator=gen(30)) * 2
    rope = dict(rope_freq=llama_freq(rotary // 2), rope_offset=OFFSETS)
    got = check(q, args, {**kw, **rope}, block_tokens=16, num_splits=3)
    plain = decode_attention_reference(q, *args, **kw)
    assert not torch.allclose(got, plain, atol=1e-2)  # the rotation matters
    check(q, args, {**kw, **rope})  # the launcher's own plan


def test_the_decode_kernel_rotates_with_a_window_a_cap_and_sinks():
    spec = QuantSpec(4, pre_rope=True)
    args, kw = token_pool(spec, QuantSpec(4))
    q = torch.randn(3, 8, 64, generator=gen(31))
    extra = dict(window=40, logit_cap=3.0, sinks=torch.randn(8, generator=gen(32)))
    rope = dict(rope_freq=llama_freq(32), rope_offset=7)
    check(q, args, {**kw, **extra, **rope}, block_tokens=16, num_splits=2)


@pytest.mark.parametrize("rotary", [64, 32])
def test_the_decode_kernel_rotates_hf_rows_and_their_tail(rotary):
    """The HF cache: contiguous rows, an unpacked tail (rotated in the tail's program), left
    padding, one offset for the batch."""
    k_spec, v_spec = QuantSpec(4, pre_rope=True), QuantSpec(8, 64)
    g = gen(33)
    k, v = (torch.randn(2, 2, 90, 64, generator=g) for _ in range(2))
    args = (quantize(k[:, :, :70], k_spec), quantize(v[:, :, :70], v_spec), k_spec, v_spec)
    kw = dict(k_tail=k[:, :, 70:], v_tail=v[:, :, 70:], starts=torch.tensor([0, 75]).int())
    q = torch.randn(2, 8, 64, generator=g)
    rope = dict(rope_freq=llama_freq(rotary // 2), rope_offset=13)
    check(q, args, {**kw, **rope}, block_tokens=16, num_splits=2)


def test_what_the_decode_kernel_leaves_to_the_general_one_with_pre_rope_keys():
    """Rotary halves narrower than a dot (R < 32) or than a chunk of 3-bit codes, and keys
    the rotation cannot act on (smoothed): the general kernel, with the same result."""

    def batch(k_spec, rotary, **kw):
        args, index = token_pool(k_spec, QuantSpec(4))
        q = torch.randn(3, 4, 64, generator=gen(34))
        fields = dict(rope_freq=llama_freq(rotary // 2), rope_offset=OFFSETS, **index, **kw)
        full = AttentionBatch(q=q.unsqueeze(1), k_rows=args[0], v_rows=args[1], k_spec=k_spec,
                              v_spec=args[3], **fields)  # fmt: skip
        return full, q, args, fields

    assert serves(batch(QuantSpec(4, pre_rope=True), 64)[0])
    assert serves(batch(QuantSpec(3, pre_rope=True), 64)[0])
    for spec, rotary in ((QuantSpec(4, pre_rope=True), 16), (QuantSpec(3, pre_rope=True), 32)):
        full, q, args, fields = batch(spec, rotary)
        assert not serves(full)
        got = decode_attention(q, *args, **fields, block_tokens=16)
        want = decode_attention_reference(q, *args, **fields)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    lam = torch.rand(2, 64, generator=gen(35)) + 0.5
    assert not serves(batch(QuantSpec(4, pre_rope=True), 64, k_smooth=lam)[0])
