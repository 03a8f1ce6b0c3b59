"""On a GPU (marker ``cuda``): pre-RoPE keys through the compiled kernel vs the reference at
real shapes. One variant (the environment's): pre-RoPE key tiles are element-wise in both, and
the values' scale-after-dot path is covered by test_decode_cuda.py."""

from __future__ import annotations

import pytest
import torch

from kvtuner.attention import (
    AttentionBatch,
    decode_attention,
    decode_attention_reference,
    extend_attention,
    extend_attention_reference,
)
from kvtuner.attention.decode_kernel import serves
from kvtuner.quant import QuantSpec, quantize

pytestmark = pytest.mark.cuda
D = 128


@pytest.mark.parametrize(
    "k_spec,half",
    [(QuantSpec(4, group_size=64), 64), (QuantSpec(3, group_size=32, axis="channel"), 16)],
    ids=["token-full", "kivi-partial"],
)
def test_compiled_prerope_keys_match_the_reference(k_spec, half):
    """Pre-RoPE keys, HF layout (rows + tail), positions up to ~20k (RoPE base 10000)."""
    torch.manual_seed(2)
    k, v = (torch.randn(2, 8, 3072 + 40, D, device="cuda") for _ in range(2))
    args = (quantize(k[:, :, :3072], k_spec), quantize(v[:, :, :3072], QuantSpec(4)))
    kw = dict(k_tail=k[:, :, 3072:].bfloat16(), v_tail=v[:, :, 3072:].bfloat16(),
              rope_freq=10000.0 ** -(torch.arange(half, device="cuda") / half),
              rope_offset=torch.tensor([0, 17000], dtype=torch.int32, device="cuda"))  # fmt: skip
    for q in (torch.randn(2, 32, D, device="cuda"), torch.randn(2, 9, 32, D, device="cuda")):
        fused = decode_attention if q.dim() == 3 else extend_attention
        reference = decode_attention_reference if q.dim() == 3 else extend_attention_reference
        got = fused(q.bfloat16(), *args, k_spec, QuantSpec(4), **kw).float()
        ref = reference(q.bfloat16(), *args, k_spec, QuantSpec(4), **kw).float()
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("half", [64, 16], ids=["full", "quarter"])
def test_compiled_decode_kernel_rotates_a_paged_pool(half):
    """The decode kernel's pre-RoPE keys (the hardware's cos/sin after a 2π reduction) at real
    shapes: a paged KV4 g32 pool in scattered slots, 4 query heads a KV head, per-request
    offsets up to ~30k; R = D and R = D/4 (the whole row passes)."""
    torch.manual_seed(3)
    lengths, spec = [4000, 1, 777], QuantSpec(4, pre_rope=True)
    slots = sum(lengths) + 64
    k, v = (torch.randn(slots, 8, D, device="cuda") for _ in range(2))
    perm = torch.randperm(slots, device="cuda").int()
    table = torch.zeros(3, max(lengths), dtype=torch.int32, device="cuda")
    for b, n in enumerate(lengths):
        table[b, :n] = perm[sum(lengths[:b]) : sum(lengths[:b]) + n]
    args = (quantize(k, spec), quantize(v, QuantSpec(4)), spec, QuantSpec(4))
    offsets = torch.tensor([0, 30000, 5], dtype=torch.int32, device="cuda")
    kw = dict(slot_table=table, lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"),
              rope_freq=10000.0 ** -(torch.arange(half, device="cuda") / half),
              rope_offset=offsets)  # fmt: skip
    q = torch.randn(3, 32, D, device="cuda").bfloat16()
    batch = AttentionBatch(q=q.unsqueeze(1), k_rows=args[0], v_rows=args[1], k_spec=spec,
                           v_spec=args[3], **kw)  # fmt: skip
    assert serves(batch)
    got = decode_attention(q, *args, **kw).float()
    ref = decode_attention_reference(q, *args, **kw).float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
