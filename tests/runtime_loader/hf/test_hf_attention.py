"""attn_implementation="kvtuner": decode through the fused kernel (forced on CPU, interpreter)
gives the greedy tokens of the dequantize-then-SDPA path (pre-RoPE keys included: the kernel
rotates them forward from the layer's first position)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_sliding_cache import WINDOW, feed, tokens

import kvtuner.attention.decode as fused_decode
from kvtuner import KVTunerError, ModelFingerprint, Profile, QuantSpec
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache, use_kvtuner_attention

KIVI_PREROPE = QuantSpec(3, group_size=8, axis="channel", pre_rope=True)


@pytest.fixture(scope="module")
def kvtuner_llama():
    return use_kvtuner_attention(tiny_model("llama"))


def uniform(model, k: QuantSpec, v: QuantSpec) -> Profile:
    return Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)


def kernel_calls(monkeypatch) -> list[int]:
    """Fused kernel launches, each one's pre-RoPE key offset (0 without; the real kernel still
    runs)."""
    calls, real = [], fused_decode.decode_attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("rope_offset", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_decode, "decode_attention", counted)
    return calls


def generate(model, profile, ids, mask=None, new=6, **cache_kw):
    """Greedy tokens and every step's logits [B, new, V]."""
    cache = make_cache(model, profile, **cache_kw)
    kw = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids, **cache_kwargs(cache), output_logits=True, return_dict_in_generate=True, **kw
    )
    return out.sequences, torch.stack(out.logits, 1)


def same_generation(got, ref) -> None:
    """Identical tokens, and logits within what rounding moves (tokens of a random tiny model
    barely depend on attention: a 1 % error in q leaves them alone, not the logits). The
    kernel's online softmax and SDPA sum in different orders, 1e-7 apart in layer 0's output;
    through two layers and lm_head that measured up to 3.7e-5 on a 2-core AMD EPYC (1e-5 on
    Intel Xeon). And the next layer quantizes its new K/V: there, 1e-7 can move a code by one
    step (K3 g16 / V6 g32 at 32-token tiles: one value of layer 1's tail 1.1e-2 apart, the
    kernel's result on either input within 1.4e-7 of the reference's), and the logits 2.2e-4."""
    assert torch.equal(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1], atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize(
    "k,v,cache_kw",
    [
        (QuantSpec(4), QuantSpec(2, group_size=16), {}),
        (QuantSpec(8, rotation="hadamard"), QuantSpec(4, symmetric=True), {"residual_length": 5}),
        (QuantSpec(3, group_size=16), QuantSpec(6), {"pack_chunk": 4}),
        (QuantSpec(4, group_size=8, axis="channel"), QuantSpec(4), {}),  # KIVI, filling block
        (QuantSpec(2, group_size=8, axis="channel"), QuantSpec(16), {"residual_length": 3}),
        (QuantSpec(5), QuantSpec(4, group_size=16), {"pack_reserve": 2}),  # rows: a buffer's prefix
        (KIVI_PREROPE, QuantSpec(4), {}),  # pre-RoPE keys: the kernel rotates blocks and tail
        (
            QuantSpec(4, pre_rope=True),
            QuantSpec(4, 16, rotation="hadamard"),
            {"residual_length": 3},
        ),
    ],
)
def test_fused_decode_gives_the_dequantize_then_sdpa_tokens(
    kvtuner_llama, monkeypatch, k, v, cache_kw
):
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    profile = uniform(kvtuner_llama, k, v)
    ref = generate(kvtuner_llama, profile, ids, decode_kernel="never", **cache_kw)
    calls = kernel_calls(monkeypatch)
    got = generate(kvtuner_llama, profile, ids, decode_kernel="always", **cache_kw)
    same_generation(got, ref)
    assert len(calls) == 5 * 2  # every decode step of both layers, none for the prefill


@pytest.mark.parametrize("k", [QuantSpec(4), KIVI_PREROPE])
def test_left_padded_batch_reads_from_each_requests_first_token(kvtuner_llama, monkeypatch, k):
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    profile = uniform(kvtuner_llama, k, QuantSpec(4))
    ref = generate(kvtuner_llama, profile, ids, mask, decode_kernel="never", residual_length=3)
    calls = kernel_calls(monkeypatch)
    got = generate(kvtuner_llama, profile, ids, mask, decode_kernel="always", residual_length=3)
    same_generation(got, ref)
    assert len(calls) == 5 * 2


def test_cpu_auto_and_channel_values_stay_on_the_dequantized_path(kvtuner_llama, monkeypatch):
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(3))
    calls = kernel_calls(monkeypatch)
    channel_v = uniform(kvtuner_llama, QuantSpec(4), QuantSpec(4, axis="channel"))
    generate(kvtuner_llama, channel_v, ids, new=3, decode_kernel="always")
    generate(kvtuner_llama, uniform(kvtuner_llama, QuantSpec(4), QuantSpec(4)), ids, new=3)
    assert calls == []  # channel-axis values: not fused; "auto" on CPU: sdpa as before


def test_other_attention_implementations_never_get_the_fused_marker(monkeypatch):
    model = tiny_model("llama")  # sdpa
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(4))
    profile = uniform(model, QuantSpec(4), QuantSpec(4))
    calls = kernel_calls(monkeypatch)
    ref = generate(use_kvtuner_attention(tiny_model("llama")), profile, ids, decode_kernel="never")
    same_generation(generate(model, profile, ids, decode_kernel="always"), ref)
    assert not calls
    with pytest.raises(KVTunerError, match="decode_kernel"):
        make_cache(model, profile, decode_kernel="sometimes")


@pytest.mark.parametrize("k", [QuantSpec(4), QuantSpec(4, pre_rope=True)])
def test_sliding_window_layers_read_their_window_then_drop(monkeypatch, k):
    """Gemma 3 (layers 0, 1: window 8; layer 2 global), left padding, decoding past the window:
    a fused step reads the stored window (its mask's width) before the oldest token leaves;
    pre-RoPE keys from the window's first position on."""
    model = use_kvtuner_attention(tiny_model("gemma3", sliding_window=WINDOW))
    ids = tokens(2, 5)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    profile = uniform(model, k, QuantSpec(4))
    kw = dict(new=10, residual_length=2)
    ref = generate(model, profile, ids, mask, decode_kernel="never", **kw)
    calls = kernel_calls(monkeypatch)
    got = generate(model, profile, ids, mask, decode_kernel="always", **kw)
    same_generation(got, ref)
    # 9 decode steps of 3 layers; the last one sees 14 tokens, its window starts at 6
    assert len(calls) == 9 * 3 and max(calls) == (5 + 9 - WINDOW if k.pre_rope else 0)
    cache = make_cache(model, profile, decode_kernel="always")
    feed(model, cache, tokens(1, 12), 4)  # no mask; between steps: window - 1 tokens stored
    assert cache.layers[0].k.num_tokens == WINDOW - 1 and cache.layers[2].k.num_tokens == 12


@pytest.mark.parametrize("additive", [False, True])
def test_mask_starts_reads_left_padding_and_refuses_holes(additive):
    from kvtuner.runtime_loader.hf.attention import mask_starts

    valid = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 0]]).bool()

    def mask(rows):
        m = rows[:, None, None, :]
        return torch.where(m, 0.0, torch.finfo(torch.float32).min) if additive else m

    length = torch.tensor(5)  # a static layer: 6 slots, 5 stored
    assert mask_starts(mask(valid[:2]), length).tolist() == [2, 0]
    assert mask_starts(mask(valid), length) is False  # request 2 skips a token
    assert mask_starts(mask(valid[:2]), 6) is False  # a dynamic layer of 6: the last is masked
    assert mask_starts(mask(valid[:2, :5]), 5).tolist() == [2, 0]
    assert mask_starts(None, 5) is None
