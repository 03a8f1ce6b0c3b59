"""The HF cache holds what nbytes() reports: no tensor keeps a larger buffer alive (CPU storage)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from kvtuner import LayerSpec, ModelFingerprint, Profile, QuantSpec
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

SPECS = [
    (QuantSpec(4), QuantSpec(4)),
    (QuantSpec(2, group_size=8, axis="channel"), QuantSpec(8, rotation="hadamard")),
    (QuantSpec(16), QuantSpec(3, group_size=16)),
]


def held_nbytes(layers) -> int:
    """Bytes of the distinct storages the layers' streams keep alive."""
    storages = {}
    for layer in layers:
        for stream in (layer.k, layer.v):
            for t in (stream.packed, stream.tail, stream.deq):
                if t is not None:
                    s = t.untyped_storage()
                    storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def bf16_llama():
    return tiny_model("llama").to(torch.bfloat16)  # bf16: tails are held at nbytes()'s 2 bytes


def ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("k,v", SPECS)
@pytest.mark.parametrize("residual_length", [0, 5])
@torch.no_grad()
def test_memory_held_equals_nbytes_after_prefill_and_every_pack(k, v, residual_length):
    model = bf16_llama()
    profile = Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)
    cache = make_cache(model, profile, residual_length=residual_length)
    out = model(ids(2, 70), **cache_kwargs(cache))
    assert held_nbytes(cache.layers) == cache.nbytes() > 0
    for _ in range(9):  # channel keys pack a block, token rows pack every step
        out = model(out.logits[:, -1:].argmax(-1), **cache_kwargs(cache))
        assert held_nbytes(cache.layers) == cache.nbytes()


@torch.no_grad()
def test_prefill_holds_no_full_precision_layer_once_it_is_packed():
    model = bf16_llama()
    profile = Profile.uniform(
        "tiny", ModelFingerprint.from_config(model.config), QuantSpec(4), QuantSpec(2)
    )
    cache = make_cache(model, profile)
    seen = []

    def check(module, args, output):  # after decoder layer i: layers 0..i hold packed rows only
        done = cache.layers[: module.self_attn.layer_idx + 1]
        seen.append((held_nbytes(done), sum(layer.nbytes() for layer in done)))

    hooks = [layer.register_forward_hook(check) for layer in model.model.layers]
    model(ids(2, 256), **cache_kwargs(cache))
    for h in hooks:
        h.remove()
    assert len(seen) == 2 and all(held == reported for held, reported in seen)
    packed = 2 * 2 * 256 * QuantSpec(4).row_bytes(32) + 2 * 2 * 256 * QuantSpec(2).row_bytes(32)
    assert seen[0][0] == packed  # layer 0: exactly its packed rows, no prefill K/V behind them


def test_a_slice_of_a_fused_projection_is_copied_not_kept_alive():
    spec = LayerSpec(0, QuantSpec(16), QuantSpec(4))
    layer = make_cache(
        bf16_llama(), [spec, LayerSpec(1, spec.k, spec.v)], residual_length=4
    ).layers[0]
    qkv = torch.randn(2, 2, 12, 3 * 32, dtype=torch.bfloat16)  # one buffer, as a fused qkv_proj
    layer.update(qkv[..., 32:64], qkv[..., 64:])
    assert held_nbytes([layer]) == layer.nbytes() < qkv.numel() * 2


@torch.no_grad()
def test_pack_reserve_grows_in_place_with_bounded_spare_and_the_same_logits():
    model = bf16_llama()
    profile = Profile.uniform(
        "tiny", ModelFingerprint.from_config(model.config), QuantSpec(4), QuantSpec(8)
    )
    exact, reserved = make_cache(model, profile), make_cache(model, profile, pack_reserve=16)
    outs = [model(ids(2, 40), **cache_kwargs(c)) for c in (exact, reserved)]
    moves = 0
    for _ in range(25):
        before = reserved.layers[0].k.packed.untyped_storage().data_ptr()
        nxt = outs[0].logits[:, -1:].argmax(-1)
        outs = [model(nxt, **cache_kwargs(c)) for c in (exact, reserved)]
        assert torch.equal(outs[0].logits, outs[1].logits)
        moves += reserved.layers[0].k.packed.untyped_storage().data_ptr() != before
        assert reserved.nbytes() == exact.nbytes() == held_nbytes(exact.layers)
        stream = reserved.layers[1].v
        spare = stream._buffer.shape[2] - stream.packed.shape[2]
        assert 0 <= spare <= 16 + stream._buffer.shape[2] // 8
    assert moves == 1  # 40 + 16 + 40 // 8 = 61 rows: one regrowth in 25 steps, not 25 copies
