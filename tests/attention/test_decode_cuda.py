"""On a GPU (marker ``cuda``): the compiled kernel vs the reference at real shapes, and the HF
cache's memory held (``torch.cuda.memory_allocated``) against ``nbytes()``."""

from __future__ import annotations

import pytest
import torch
from conftest import cuda_kernel_launches, tiny_model

from kvtuner import ModelFingerprint, Profile, QuantSpec
from kvtuner.attention import (
    AttentionBatch,
    attend,
    choose_splits,
    decode_attention,
    decode_attention_reference,
    decode_kernel,
    extend_attention,
    extend_attention_reference,
)
from kvtuner.attention.decode_kernel import plan_decode
from kvtuner.quant import quantize, scatter_quantized
from kvtuner.quant.planes import from_planes, layer_planes
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache, use_kvtuner_attention

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("attention_variant")]  # both variants
D = 128


@pytest.mark.parametrize(
    "k_spec,v_spec",
    [(QuantSpec(4, 128), QuantSpec(4, 128)), (QuantSpec(8, 64), QuantSpec(4))],
    ids=lambda s: s.short(),
)
def test_a_pool_of_planes_reads_as_its_rows_at_real_shapes(k_spec, v_spec):
    """Planes packed by the pool kernel and read by the decode and extend kernels (their codes
    in 16-byte copies in the sm_90a build) against the reference over the same rows."""
    torch.manual_seed(1)
    slots, lengths = 4 * 4096, [4096, 1, 2000, 333]
    every = torch.arange(slots, device="cuda")
    pools, rows = [], []
    for spec, planes in zip((k_spec, v_spec), layer_planes(k_spec, v_spec, D, 8), strict=True):
        x = torch.randn(slots, 8, D, device="cuda", dtype=torch.bfloat16)
        pool = torch.empty(slots, 8, spec.row_bytes(D), dtype=torch.uint8, device="cuda")
        scatter_quantized(pool, every, x, spec, planes=planes)
        rows.append(quantize(x, spec))
        assert planes and torch.equal(from_planes(pool, spec, D), rows[-1])
        pools.append(pool)
    table = torch.randperm(slots, device="cuda").to(torch.int32).view(4, 4096)
    kw = dict(lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"), slot_table=table)
    q = torch.randn(4, 32, D, device="cuda", dtype=torch.bfloat16)
    got = decode_attention(q, *pools, k_spec, v_spec, planes=True, **kw).float()
    ref = decode_attention_reference(q, *rows, k_spec, v_spec, **kw).float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    qx = torch.randn(4, 17, 32, D, device="cuda", dtype=torch.bfloat16)
    got = extend_attention(qx, *pools, k_spec, v_spec, planes=True, **kw).float()
    ref = extend_attention_reference(qx, *rows, k_spec, v_spec, **kw).float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "k_spec,v_spec",
    [
        (QuantSpec(2), QuantSpec(2)),
        (QuantSpec(3), QuantSpec(5, symmetric=True)),
        (QuantSpec(4), QuantSpec(4)),
        (QuantSpec(6, group_size=64), QuantSpec(8, group_size=64)),
        (QuantSpec(16), QuantSpec(4, rotation="hadamard")),
    ],
    ids=lambda s: s.short(),
)
def test_compiled_kernel_matches_the_reference_at_real_shapes(k_spec, v_spec):
    torch.manual_seed(0)
    lengths = [3000, 1, 777, 4096]
    slots = 4 * 4096 + 64  # the table's [4, 4096] slots are distinct
    k = torch.randn(slots, 8, D, device="cuda")
    v = torch.randn(slots, 8, D, device="cuda")
    k_rows, v_rows = quantize(k, k_spec), quantize(v, v_spec)
    perm = torch.randperm(slots, device="cuda").to(torch.int32)
    table = torch.zeros(4, max(lengths), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(lengths):
        table[b, :n] = perm[used : used + n]
        used += n
    kw = dict(lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"), slot_table=table)
    q = torch.randn(4, 32, D, device="cuda", dtype=torch.bfloat16)
    got = decode_attention(q, k_rows, v_rows, k_spec, v_spec, **kw).float()
    ref = decode_attention_reference(q, k_rows, v_rows, k_spec, v_spec, **kw).float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    qx = torch.randn(4, 33, 32, D, device="cuda", dtype=torch.bfloat16)
    got = extend_attention(qx, k_rows, v_rows, k_spec, v_spec, **kw).float()
    ref = extend_attention_reference(qx, k_rows, v_rows, k_spec, v_spec, **kw).float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "extra",
    [dict(window=512), dict(window=4096, logit_cap=30.0), dict(window=128, sinks=True)],
    ids=["window", "gemma2", "gpt-oss"],
)
def test_compiled_window_cap_and_sinks_match_the_reference(extra):
    torch.manual_seed(1)
    spec, lengths = QuantSpec(4), [3000, 1, 777, 4096]
    slots = 4 * 4096 + 64  # the table's [4, 4096] slots are distinct
    k_rows, v_rows = (quantize(torch.randn(slots, 8, D, device="cuda"), spec) for _ in range(2))
    table = torch.randperm(slots, device="cuda").to(torch.int32)[: 4 * 4096].view(4, 4096)
    kw = dict(lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"), slot_table=table)
    extra = dict(extra)  # the parametrized dict is shared by every variant
    if extra.pop("sinks", False):
        extra["sinks"] = torch.randn(32, device="cuda")
    args = (k_rows, v_rows, spec, spec)
    for q in (torch.randn(4, 32, D, device="cuda"), torch.randn(4, 33, 32, D, device="cuda")):
        fused = decode_attention if q.dim() == 3 else extend_attention
        reference = decode_attention_reference if q.dim() == 3 else extend_attention_reference
        got = fused(q.bfloat16(), *args, **kw, **extra).float()
        ref = reference(q.bfloat16(), *args, **kw, **extra).float()
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("spec", [QuantSpec(4), QuantSpec(8, group_size=64)], ids=str)
def test_compiled_extend_with_the_new_tokens_in_hand_matches_the_reference(spec):
    """SGLang's ragged extend as the backend runs it: the prefix from packed rows, each
    request's new tokens (bf16, in hand) exact; a prefill of 512 tokens with no prefix too."""
    torch.manual_seed(2)
    lengths, new = [3000, 512, 777, 4096], [33, 512, 1, 100]
    slots = 4 * 4096 + 64
    k_rows, v_rows = (quantize(torch.randn(slots, 8, D, device="cuda"), spec) for _ in range(2))
    table = torch.randperm(slots, device="cuda").to(torch.int32)[: 4 * 4096].view(4, 4096)
    indptr = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    kw = dict(lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"), slot_table=table,
              qo_indptr=indptr.cuda(), max_q_len=max(new))  # fmt: skip
    n = sum(new)
    q = torch.randn(n, 32, D, device="cuda", dtype=torch.bfloat16)
    kw["k_new"], kw["v_new"] = (torch.randn(n, 8, D, device="cuda").bfloat16() for _ in "kv")
    args = (k_rows, v_rows, spec, spec)
    got = extend_attention(q, *args, **kw).float()
    torch.testing.assert_close(got, extend_attention_reference(q, *args, **kw).float(),
                               atol=2e-2, rtol=2e-2)  # fmt: skip


def test_a_step_launches_its_kernel_and_the_merge():
    """Eager steps pay a host launch a kernel: a decode step as SGLang's backend runs it (table
    rows given) is its kernel and the merge, which stores q's dtype (no cast after it: the H200
    counted 2 launches where this test held 3); so is an extend step with the new tokens in hand
    (bf16, made fp16 inside the kernel). No dummy buffers, no conversions around them."""
    spec, lengths, new = QuantSpec(4), [3000, 512, 777, 4096], [33, 512, 1, 100]
    k_rows, v_rows = (quantize(torch.randn(16448, 8, D, device="cuda"), spec) for _ in range(2))
    table = torch.randperm(16448, device="cuda").to(torch.int32)[: 4 * 4096].view(4, 4096)
    kw = dict(lengths=torch.tensor(lengths, dtype=torch.int32, device="cuda"), slot_table=table,
              table_rows=torch.arange(4, dtype=torch.int32, device="cuda"))  # fmt: skip
    args = (k_rows, v_rows, spec, spec)
    q = torch.randn(4, 32, D, device="cuda", dtype=torch.bfloat16)
    assert cuda_kernel_launches(lambda: decode_attention(q, *args, **kw)) == 2
    indptr = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    kw.update(qo_indptr=indptr.cuda(), max_q_len=max(new))
    q = torch.randn(sum(new), 32, D, device="cuda", dtype=torch.bfloat16)
    kw["k_new"], kw["v_new"] = (torch.randn(sum(new), 8, D, device="cuda").bfloat16() for _ in "kv")
    assert cuda_kernel_launches(lambda: extend_attention(q, *args, **kw)) == 2


def test_one_warp_splits_follow_the_programs_an_sm_measured_at_the_first_launch():
    """A decode step records its build's programs an SM (registers and shared memory on this
    GPU); the next plan cuts two whole waves of them: 11 an SM for KV4 g32 in the sm_90a build
    of value tiles in lane order (8 before)."""
    spec = QuantSpec(4)
    k_rows, v_rows = (quantize(torch.randn(16 * 2048, 8, D, device="cuda"), spec) for _ in "kv")
    table = torch.arange(16 * 2048, device="cuda", dtype=torch.int32).view(16, 2048)
    lengths = torch.full((16,), 2048, dtype=torch.int32, device="cuda")
    q = torch.randn(16, 1, 32, D, device="cuda", dtype=torch.bfloat16)
    batch = AttentionBatch(q=q, k_rows=k_rows, v_rows=v_rows, k_spec=spec, v_spec=spec,
                           lengths=lengths, slot_table=table)  # fmt: skip
    attend(batch)
    plan = plan_decode(batch)  # at the cap on registers fitted at that launch
    measured = decode_kernel._PROGRAMS_AN_SM[
        decode_kernel._build_key(
            batch, plan.block_tokens, plan.num_warps, plan.num_stages, plan.max_registers
        )  # fmt: skip
    ]
    assert plan.num_warps == 1 and 8 <= measured <= 16, measured
    assert plan.max_registers in (None, *decode_kernel.REGISTER_CAPS), plan
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = choose_splits(16, 8, 2048, q.device, sms=sms, num_warps=1, programs_an_sm=measured)
    assert plan.splits == want


def test_a_cuda_graph_captures_decode_after_one_eager_call():
    """The first launch of a build measures its programs an SM, and the plan after it may split
    otherwise: that plan is compiled in the same eager call, so a capture compiles nothing
    (it cannot load a module); so is the build at the cap on registers fitted at that launch."""
    decode_kernel._PROGRAMS_AN_SM.clear()
    decode_kernel._FITTED.clear()
    spec = QuantSpec(4)
    k_rows, v_rows = (quantize(torch.randn(4 * 2048, 8, D, device="cuda"), spec) for _ in "kv")
    table = torch.arange(4 * 2048, device="cuda", dtype=torch.int32).view(4, 2048)
    lengths = torch.tensor([2048, 1000, 17, 1500], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 32, D, device="cuda", dtype=torch.bfloat16)
    kw = dict(slot_table=table, lengths=lengths)
    want = decode_attention(q, k_rows, v_rows, spec, spec, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = decode_attention(q, k_rows, v_rows, spec, spec, **kw)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want)


@torch.inference_mode()
def test_hf_cache_holds_what_nbytes_reports_after_prefill_and_decode():
    model = use_kvtuner_attention(
        tiny_model("llama", head_dim=64, max_position_embeddings=4096).to("cuda", torch.bfloat16)
    )
    fp = ModelFingerprint.from_config(model.config)
    profile = Profile.uniform("tiny", fp, QuantSpec(4), QuantSpec(4))
    ids = torch.randint(0, 256, (4, 2048), device="cuda")
    model(
        ids[:, :8], use_cache=False
    )  # cuBLAS's workspace (32 MiB on Hopper) and other first-use buffers
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    cache = make_cache(model, profile)
    out = model(ids, **cache_kwargs(cache), logits_to_keep=1)
    for _ in range(5):
        out = model(out.logits[:, -1:].argmax(-1), **cache_kwargs(cache), logits_to_keep=1)
    del out
    torch.cuda.synchronize()
    tensors = 4 * len(cache.layers)  # packed rows and a tail per K and V stream
    held = torch.cuda.memory_allocated() - base
    assert cache.nbytes() <= held <= cache.nbytes() + 512 * tensors  # 512 B allocator rounding
