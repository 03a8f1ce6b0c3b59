"""Channel-axis (KIVI) keys through the kvtuner backend: the kernels read the pool's pages (full
pages' blocks, filling pages' staged fp values) and match SGLang's stock TorchNativeAttnBackend
over the dequantized pool, with the real SGLang classes on CPU tensors (TRITON_INTERPRET).
Pre-RoPE keys: the kernels turn every key tile (blocks and staged pages) by its position."""

from __future__ import annotations

import pytest
import torch
from tiny_profiles import pool_over, tiny_profile

from kvtuner.errors import KVTunerError
from kvtuner.quant import QuantSpec

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

G, HEADS, D, Q_HEADS, PAGES = 16, 2, 64, 8, 14
SIZE = G * (PAGES - 1)
SPECS = [  # KIVI keys with token-axis values, a symmetric 3-bit key, a per-token layer, and
    # KIVI keys stored before RoPE
    (QuantSpec(4, G, axis="channel"), QuantSpec(4, 32)),
    (QuantSpec(3, G, symmetric=True, axis="channel"), QuantSpec(8)),
    (QuantSpec(4), QuantSpec(2, symmetric=True)),
    (QuantSpec(3, G, axis="channel", pre_rope=True), QuantSpec(4, 32)),
]
FREQ = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
ROWS = [3, 1, 6, 2]  # req_pool_indices: not in order
PAGE_OF = [[2, 9, 5], [7], [1, 12], [4, 11, 3]]  # each request's pages, as the allocator hands


def radix(layer_id):
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(Q_HEADS, D, D**-0.5, HEADS, layer_id)


def runner(pool, req_to_token_pool):
    from types import SimpleNamespace

    return SimpleNamespace(device="cpu", token_to_kv_pool=pool,
                           req_to_token_pool=req_to_token_pool, model=None)  # fmt: skip


@pytest.fixture
def parts():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    profile = tiny_profile(SPECS, heads=HEADS, head_dim=D)
    packed = pool_over(profile, SIZE, page_size=G, read_mode="packed")
    packed._parts.rope.bind(FREQ)  # what the plugin binds from the model before the first forward
    stock = MHATokenToKVPool(SIZE, page_size=G, dtype=torch.float32, head_num=HEADS,
                             head_dim=D, layer_num=len(SPECS), device="cpu",
                             enable_memory_saver=False)  # fmt: skip
    req_to_token = ReqToTokenPool(8, 64, "cpu", False)
    for row, pages in zip(ROWS, PAGE_OF, strict=True):
        slots = torch.cat([torch.arange(p * G, p * G + G) for p in pages])
        req_to_token.req_to_token[row, : len(slots)] = slots.int()
    return packed, stock, req_to_token


class Positions:  # what the plugin reads from SGLang's ForwardBatch before a forward
    def __init__(self, loc, positions):
        self.out_cache_loc, self.positions = loc, positions


def fill(packed, req_to_token, prefix, g):
    """Each request's prefix written in two chunks (a page may fill across them)."""
    for row, n in zip(ROWS, prefix, strict=True):
        loc = req_to_token.req_to_token[row, :n].long()
        packed.note_positions(Positions(loc, torch.arange(n)))
    for layer_id in range(len(SPECS)):
        for row, n in zip(ROWS, prefix, strict=True):
            loc = req_to_token.req_to_token[row, :n].long()
            k, v = (torch.randn(n, HEADS, D, generator=g) * 2 for _ in range(2))
            for part in (slice(0, n // 2), slice(n // 2, n)):
                packed.set_kv_buffer(radix(layer_id), loc[part], k[part], v[part])


def forward_batch(mode, prefix, new, req_to_token):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    totals = [p + n for p, n in zip(prefix, new, strict=True)]
    table = req_to_token.req_to_token
    loc = torch.cat([table[r, p:t] for r, p, t in zip(ROWS, prefix, totals, strict=True)]).long()
    extend = dict(extend_seq_lens=torch.tensor(new), extend_prefix_lens=torch.tensor(prefix),
                  extend_seq_lens_cpu=list(new), extend_prefix_lens_cpu=list(prefix),
                  extend_num_tokens=sum(new))  # fmt: skip
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE if mode == "decode" else ForwardMode.EXTEND,
        batch_size=len(ROWS), input_ids=torch.zeros(sum(new), dtype=torch.long),
        req_pool_indices=torch.tensor(ROWS), seq_lens=torch.tensor(totals), out_cache_loc=loc,
        seq_lens_sum=sum(totals), seq_lens_cpu=torch.tensor(totals),
        **(extend if mode == "extend" else {}),
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_kivi_keys_match_torch_native_over_the_dequantized_pool(parts, mode):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, stock, req_to_token = parts
    g = torch.Generator().manual_seed(1)
    prefix, new = (
        ([38, 5, 16, 31], [1] * 4) if mode == "decode" else ([32, 0, 12, 20], [5, 9, 1, 3])
    )
    fill(packed, req_to_token, prefix, g)
    fb = forward_batch(mode, prefix, new, req_to_token)
    at = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, new, strict=True)])
    packed.note_positions(Positions(fb.out_cache_loc, at))
    ours, theirs = (KVTunerAttnBackend(runner(packed, req_to_token)),
                    TorchNativeAttnBackend(runner(stock, req_to_token)))  # fmt: skip
    ours.init_forward_metadata(fb)
    theirs.init_forward_metadata(fb)
    assert packed.channel_keys(0).staged_pages > 0 and packed.channel_keys(2) is None
    every = torch.arange(SIZE + G)
    for layer_id in range(len(SPECS)):
        q = torch.randn(sum(new), Q_HEADS * D, generator=g)
        k, v = (torch.randn(sum(new), HEADS, D, generator=g) for _ in range(2))
        got = ours.forward(q, k, v, radix(layer_id), fb)  # stores the new tokens, attends
        stock.k_buffer[layer_id][:], stock.v_buffer[layer_id][:] = packed.read_kv(layer_id, every)
        # extend on the extend kernel (token-axis keys, KIVI pages) attends the new tokens as
        # computed; pre-RoPE KIVI keys (the general kernel) read them back from the pool
        exact = mode == "extend" and not SPECS[layer_id][0].pre_rope
        want = theirs.forward(q, k, v, radix(layer_id), fb, save_kv_cache=exact)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_channel_axis_values_are_refused_in_one_line():
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    specs = [(QuantSpec(4, G, axis="channel"), QuantSpec(4, G, axis="channel"))]
    packed = pool_over(tiny_profile(specs, heads=HEADS, head_dim=D), SIZE, page_size=G,
                       read_mode="packed")  # fmt: skip
    model = torch.nn.ModuleList([radix(0)])
    run = runner(packed, ReqToTokenPool(2, 64, "cpu", False))
    run.model = model
    with pytest.raises(KVTunerError, match="channel-axis \\(KIVI\\) values") as info:
        KVTunerAttnBackend(run)
    assert "\n" not in str(info.value)
