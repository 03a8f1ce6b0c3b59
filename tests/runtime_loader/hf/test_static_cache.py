"""make_cache(..., max_cache_len): packed slots allocated once. Its tokens and logits are the
dynamic packed cache's (every token quantized), and ``generate`` compiles its decode step into
one graph, without a break, and reuses it for a new cache (no recompile)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_hf_attention import same_generation
from test_sliding_cache import WINDOW
from transformers import CompileConfig

from kvtuner import KVTunerError, LayerSpec, ModelFingerprint, Profile, QuantSpec
from kvtuner.quant import KeySmoothing
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache, use_kvtuner_attention
from kvtuner.runtime_loader.hf.attention import is_fused

K4 = QuantSpec(4)


def uniform(model, k: QuantSpec = K4, v: QuantSpec = K4) -> Profile:
    return Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)


def prompt(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, profile, ids, *, mask=None, new=6, compile_config=None,
             disable_compile=False, **cache_kw):  # fmt: skip
    """Greedy tokens and every step's logits [B, new, V]."""
    cache = make_cache(model, profile, **cache_kw)
    out = model.generate(
        ids, **cache_kwargs(cache), attention_mask=mask, max_new_tokens=new, do_sample=False,
        pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        compile_config=compile_config, disable_compile=disable_compile,
    )  # fmt: skip
    return out.sequences, torch.stack(out.logits, 1)


def compiled() -> CompileConfig:
    """generate's own compile of the decode step, on CPU: the whole graph or an error."""
    config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA only, unless told
    return config


@pytest.mark.parametrize("kernel", ["never", "always"])
def test_static_cache_gives_the_dynamic_caches_generation(tiny_any, kernel):
    model = use_kvtuner_attention(tiny_any)
    profile, ids = uniform(model, QuantSpec(4), QuantSpec(8, 16)), prompt()
    ref = generate(model, profile, ids, decode_kernel=kernel)
    got = generate(model, profile, ids, decode_kernel=kernel, max_cache_len=40)
    same_generation(got, ref)


@pytest.mark.parametrize("kernel", ["never", "always"])
def test_generate_compiles_one_graph_and_reuses_it_for_a_new_cache(tiny_llama, kernel):
    from torch._dynamo.utils import counters

    model = use_kvtuner_attention(tiny_llama)
    profile, ids = uniform(model), prompt()
    eager = generate(model, profile, ids, decode_kernel=kernel, max_cache_len=24)
    torch._dynamo.reset()
    counters.clear()
    for _ in range(2):
        got = generate(model, profile, ids, decode_kernel=kernel, max_cache_len=24,
                       compile_config=compiled())  # fmt: skip
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


@pytest.mark.parametrize("kernel", ["never", "always"])
def test_left_padding_reads_from_each_requests_first_token(tiny_llama, kernel):
    model = use_kvtuner_attention(tiny_llama)
    profile, ids = uniform(model), prompt()
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ref = generate(model, profile, ids, mask=mask, decode_kernel=kernel)
    got = generate(model, profile, ids, mask=mask, decode_kernel=kernel, max_cache_len=20)
    same_generation(got, ref)


def test_window_layers_read_only_the_window_past_it():
    model = use_kvtuner_attention(tiny_model("gemma3"))
    profile, ids = uniform(model, QuantSpec(4, 16), QuantSpec(4, 16)), prompt(length=13)
    for kernel in ("never", "always"):
        ref = generate(model, profile, ids, new=2 * WINDOW, decode_kernel=kernel)
        got = generate(model, profile, ids, new=2 * WINDOW, decode_kernel=kernel,
                       max_cache_len=13 + 2 * WINDOW)  # fmt: skip
        same_generation(got, ref)


def test_smoothed_and_rotated_keys():
    model = use_kvtuner_attention(tiny_model("llama"))
    lam = KeySmoothing(tuple(tuple(0.5 + 0.25 * (c % 5) for c in range(32)) for _ in range(2)))
    rotated = QuantSpec(4, rotation="hadamard")
    layers = [LayerSpec(0, QuantSpec(4), K4, lam), LayerSpec(1, rotated, rotated)]
    profile = Profile("tiny", ModelFingerprint.from_config(model.config), layers)
    for kernel in ("never", "always"):
        ref = generate(model, profile, prompt(), decode_kernel=kernel)
        got = generate(model, profile, prompt(), decode_kernel=kernel, max_cache_len=18)
        same_generation(got, ref)


def test_slots_as_planes_where_they_align_codes():
    """KV4 g128 at d 128 and 4 KV heads: 68-byte rows, 272-byte slots, codes 16 bytes apart."""
    model = use_kvtuner_attention(tiny_model(head_dim=128, num_attention_heads=8,
                                             num_key_value_heads=4, hidden_size=256))  # fmt: skip
    profile, ids = uniform(model, QuantSpec(4, 128), QuantSpec(8, 64)), prompt()
    cache = make_cache(model, profile, max_cache_len=18)
    model(ids, **cache_kwargs(cache))
    assert cache.layers[0].planes == (True, True)
    for kernel in ("never", "always"):
        ref = generate(model, profile, ids, decode_kernel=kernel)
        got = generate(model, profile, ids, decode_kernel=kernel, max_cache_len=18)
        same_generation(got, ref)


def test_holds_every_slot_from_the_first_update(tiny_llama):
    profile, ids = uniform(tiny_llama, QuantSpec(4), QuantSpec(2)), prompt(length=5)
    cache = make_cache(tiny_llama, profile, max_cache_len=32)
    assert cache.nbytes() == 0
    tiny_llama(ids, **cache_kwargs(cache))
    slots = 2 * 32 * 2  # batch × max_cache_len × KV heads
    assert cache.nbytes() == 2 * slots * (K4.row_bytes(32) + QuantSpec(2).row_bytes(32))
    assert int(cache.get_seq_length()) == 5
    cache.reset()
    assert int(cache.get_seq_length()) == 0 and not cache.layers[0].k_rows.any()


@pytest.mark.parametrize(
    "spec,kw,match",
    [
        (QuantSpec(4, axis="channel"), {}, "channel-axis"),
        (QuantSpec(4, pre_rope=True), {}, "pre-RoPE"),
        (K4, {"residual_length": 4}, "defaults"),
        (K4, {"max_cache_len": 0}, "max_cache_len must be"),
    ],
)
def test_refuses_what_slots_do_not_store(tiny_llama, spec, kw, match):
    profile = uniform(tiny_llama, spec, K4)
    with pytest.raises(KVTunerError, match=match):
        make_cache(tiny_llama, profile, **{"max_cache_len": 16, **kw})


def test_a_prefill_longer_than_the_slots_is_one_line(tiny_llama):
    cache = make_cache(tiny_llama, uniform(tiny_llama), max_cache_len=8)
    with pytest.raises(KVTunerError, match="holds 8 tokens a request"):
        tiny_llama(prompt(length=9), **cache_kwargs(cache))


def test_other_attention_reads_the_dequantized_slots(tiny_llama):
    """sdpa (no kvtuner attention) gets every slot dequantized and masked: the same logits."""
    profile, ids = uniform(tiny_llama), prompt()
    ref = generate(use_kvtuner_attention(tiny_llama), profile, ids, max_cache_len=20)
    tiny_llama.set_attn_implementation("sdpa")
    got = generate(tiny_llama, profile, ids, max_cache_len=20)
    same_generation(got, ref)


@pytest.mark.cuda
def test_on_a_gpu_generate_replays_its_decode_step_as_cuda_graphs():
    """transformers' own compile of the step (inductor, CUDA graphs): one graph, no break, no
    CUDA-graph skip, the eager generation's tokens."""
    from torch._dynamo.utils import counters

    model = tiny_model("llama", head_dim=128, num_attention_heads=8, num_key_value_heads=2,
                       hidden_size=256)  # fmt: skip
    model = use_kvtuner_attention(model.to("cuda", torch.bfloat16))
    profile, ids = uniform(model), prompt().cuda()
    eager = generate(model, profile, ids, new=8, max_cache_len=40, disable_compile=True)
    torch._dynamo.reset()
    counters.clear()
    got = generate(model, profile, ids, new=8, max_cache_len=40)
    assert torch.equal(got[0], eager[0])
    torch.testing.assert_close(got[1], eager[1], atol=5e-2, rtol=0)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert not counters["inductor"]["cudagraph_skips"]


def test_apply_builds_the_static_cache_and_switches_the_attention(tiny_llama):
    import kvtuner
    from kvtuner.runtime_loader.hf.static_layer import KVTunerStaticLayer

    cache = kvtuner.apply(tiny_llama, uniform(tiny_llama), max_cache_len=16)
    assert all(isinstance(layer, KVTunerStaticLayer) for layer in cache.layers)
    assert cache.is_compileable and tiny_llama.config._attn_implementation == "kvtuner"


@pytest.mark.slow
def test_smollm2_compiled_static_generation_is_the_eager_ones(smollm2):
    """The real SmolLM2 (30 layers, 3 KV heads, d 64), K4 / V2, a left-padded batch: compiling
    the decode step changes no token and no logit. (Against the dynamic cache, a 30-layer
    model at 2-3 bits does not stay bit-equal: SDPA over 6 keys or over 32 with 26 masked
    rounds 1e-7 apart, and a 3-bit code moved by that in one layer moved the last layer's
    logits by 0.59; the tiny models above hold the two caches to one another.)"""
    model, tok = smollm2
    model = use_kvtuner_attention(model)
    profile = uniform(model, QuantSpec(4), QuantSpec(2))
    ids = tok(["The capital of France is", "def fibonacci(n):"], return_tensors="pt",
              padding=True, padding_side="left")  # fmt: skip
    kw = dict(mask=ids.attention_mask, new=8, decode_kernel="never", max_cache_len=32)
    eager = generate(model, profile, ids.input_ids, **kw)
    got = generate(model, profile, ids.input_ids, compile_config=compiled(), **kw)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


def test_a_decode_step_hands_attention_its_tagged_slots(tiny_llama):
    """Whatever keywords the model passes ``cache.update`` (none before transformers 5.2x),
    a decode step returns the key slots tagged with their layer; a prefill the history."""
    cache = make_cache(use_kvtuner_attention(tiny_llama), uniform(tiny_llama), max_cache_len=8)
    k, v = torch.randn(2, 2, 3, 32), torch.randn(2, 2, 3, 32)
    keys, _ = cache.update(k, v, 0)
    assert not is_fused(keys) and keys.dtype == torch.float32 and keys.shape == (2, 2, 8, 32)
    keys, values = cache.update(k[:, :, :1], v[:, :, :1], 0)
    assert is_fused(keys) and keys._kvtuner_layer is cache.layers[0]
    assert keys.dtype == values.dtype == torch.uint8


@pytest.mark.slow
def test_gemma3_hybrid_windows_at_head_dim_256(gemma3):
    """The real Gemma 3 270M (5 window layers to 1 global, d 256, 1 KV head), KV8 g64: the
    static cache's tokens are the dynamic cache's, and compiled, the fused kernel's too."""
    model, tok = gemma3
    model = use_kvtuner_attention(model)
    profile = uniform(model, QuantSpec(8, 64), QuantSpec(8, 64))
    ids = tok(["The capital of France is"], return_tensors="pt")
    kw = dict(mask=ids.attention_mask, new=10)
    ref = generate(model, profile, ids.input_ids, decode_kernel="never", **kw)
    got = generate(model, profile, ids.input_ids, decode_kernel="never", max_cache_len=40, **kw)
    same_tokens_and_logits_but_a_code(got, ref)
    fused = generate(model, profile, ids.input_ids, decode_kernel="always", max_cache_len=40,
                     compile_config=compiled(), **kw)  # fmt: skip
    same_tokens_and_logits_but_a_code(fused, got)


def same_tokens_and_logits_but_a_code(got, ref) -> None:
    """Identical tokens; the prefill's logits within rounding, and every step's within 0.5: the
    two runs' attention, summed in another order (a static cache's 40 slots against the tokens
    so far), can move a new token's 8-bit code by one step, and a moved code stays in the cache
    for the steps after it. On a 2-core AMD EPYC the 10th step's logits moved 0.17 (the other
    nine 1.8e-5 at most); on one torch thread (CI's core tier) the 7th to 10th moved 3.6e-3 to
    0.17."""
    assert torch.equal(got[0], ref[0])
    off = (got[1] - ref[1]).abs().amax(-1)  # [B, new]: each step's largest difference
    assert (off[:, 0] < 1e-3).all() and off.max() < 0.5, off
