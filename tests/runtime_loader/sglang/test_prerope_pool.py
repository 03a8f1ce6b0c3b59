"""Pre-RoPE channel-axis keys in KVTunerMHATokenToKVPool (real SGLang classes on CPU): keys
written after RoPE are turned back by their slots' positions before they are staged and packed
(the HF cache's bytes), and forward again on every read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_channel_pool import HEADS, SIZE, D, G, request_slots
from test_pool import Layer
from tiny_profiles import pool_over, tiny_profile

from kvtuner.attention.rope import rope_rotate_at
from kvtuner.errors import KVTunerError
from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

KEY = QuantSpec(3, G, axis="channel", pre_rope=True)
SPECS = [(KEY, QuantSpec(4, 32)), (QuantSpec(4, G, axis="channel"), QuantSpec(4, 32))]
FREQ = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)  # llama's inv_freq, head_dim D


def make_pool(rope_freq=FREQ, **kw):
    """The pool class as the plugin binds it: with the model's frequencies (None: unbound)."""
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    profile = tiny_profile(SPECS, heads=HEADS, head_dim=D)
    cls = KVTunerMHATokenToKVPool.bound(profile, "lazy", rope_freq=rope_freq)
    return pool_over(profile, SIZE, cls=cls, page_size=G, **kw)


class Batch:  # what the plugin reads from SGLang's ForwardBatch before a forward
    def __init__(self, loc, positions):
        self.out_cache_loc, self.positions = loc, positions


def turn(x, positions, forward):
    """x [n, heads, D] -> fp32, rotated by each row's position."""
    return rope_rotate_at(x.transpose(0, 1), FREQ, positions, forward=forward).transpose(0, 1)


def write(pool, slots, positions, keys, values, splits):
    """Decode-like writes of post-RoPE keys: positions noted before each forward."""
    start = 0
    for n in splits:
        part = slice(start, start + n)
        pool.note_positions(Batch(slots[part], positions[part]))
        for layer in range(len(SPECS)):
            pool.set_kv_buffer(Layer(layer), slots[part], keys[part], values[part])
        start += n


@pytest.fixture
def written():
    """A request of 40 tokens at positions 100..139 over pages 5, 2 and 7 (7 still filling)."""
    pool = make_pool()
    slots, positions = request_slots([5, 2, 7], 40), torch.arange(100, 140)
    g = torch.Generator().manual_seed(0)
    plain = torch.randn(40, HEADS, D, generator=g) * 2  # the keys before RoPE
    keys, values = turn(plain, positions, True), torch.randn(40, HEADS, D, generator=g)
    write(pool, slots, positions, keys, values, [20, 1, 1, 9, 9])
    return pool, slots, plain, keys


def test_full_pages_hold_the_channel_blocks_of_the_unrotated_keys(written):
    pool, _, plain, keys = written
    pages = plain[:32].reshape(2, G, HEADS, D).transpose(1, 2)  # [page, heads, G, D]
    want = quantize(pages, KEY).squeeze(2)  # the HF cache's bytes for these keys
    assert torch.equal(pool.k_buffer[0][[5, 2]], want)
    post = keys[:32].reshape(2, G, HEADS, D).transpose(1, 2)
    assert not torch.equal(quantize(post, KEY).squeeze(2), want)  # the layer without pre_rope


def test_reads_turn_the_keys_forward_to_their_positions(written):
    pool, slots, plain, keys = written
    k_hat, _ = pool.read_kv(0, slots)
    pages = plain[:32].reshape(2, G, HEADS, D).transpose(1, 2)
    packed = dequantize(quantize(pages, KEY), KEY, D, torch.float32)  # [2, heads, G, D]
    want = turn(packed.transpose(1, 2).reshape(32, HEADS, D), torch.arange(100, 132), True)
    torch.testing.assert_close(k_hat[:32], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_hat[32:], keys[32:], atol=1e-5, rtol=1e-5)  # staged page
    assert pool._parts.stored.channels[0][0].staged_pages == 1


def test_a_request_sharing_the_prefix_reads_it_at_the_prefix_positions():
    pool = make_pool()
    shared, tail = request_slots([3, 4], 32), request_slots([6], 4)
    plain = torch.randn(36, HEADS, D, generator=torch.Generator().manual_seed(1))
    keys = turn(plain, torch.arange(36), True)
    write(pool, shared, torch.arange(32), keys[:32], plain[:32], [32])
    before = pool.read_kv(0, shared)[0]
    write(pool, tail, torch.arange(32, 36), keys[32:], plain[32:], [3, 1])  # request B's own
    b_keys = pool.read_kv(0, torch.cat([shared, tail]))[0]
    assert torch.equal(b_keys[:32], before)
    torch.testing.assert_close(b_keys[32:], keys[32:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(before, keys[:32], atol=0.5, rtol=0)  # 3-bit blocks, turned


def test_cell_size_counts_a_position_per_slot():
    profile = make_pool().profile
    shape = dict(heads=HEADS, start_layer=0, num_layers=2, dtype_bytes=4, read_mode="lazy")
    cell = cell_size(profile, **shape)
    assert cell.positions == 4 and cell.total == cell.packed + 4
    plain = tiny_profile(SPECS[1:], heads=HEADS, head_dim=D)
    assert cell_size(plain, heads=HEADS, start_layer=0, num_layers=1, dtype_bytes=4).positions == 0


def test_writes_before_the_frequencies_are_bound_fail_in_one_line():
    pool = make_pool(rope_freq=None)
    with pytest.raises(KVTunerError) as err:
        pool.set_kv_buffer(Layer(0), torch.tensor([G]), torch.ones(1, HEADS, D),
                           torch.ones(1, HEADS, D))  # fmt: skip
    assert "rotary frequencies" in str(err.value) and "\n" not in str(err.value)
    pool._parts.rope.bind(FREQ)
    with pytest.raises(KVTunerError, match="one position per written slot"):
        pool.note_positions(Batch(torch.tensor([G]), torch.zeros(3, 1)))


def test_token_axis_prerope_keys_are_refused_in_one_line():
    token = tiny_profile([(QuantSpec(4, 32, pre_rope=True), QuantSpec(4, 32))], heads=HEADS,
                         head_dim=D)  # fmt: skip
    with pytest.raises(KVTunerError) as err:
        pool_over(token, SIZE, page_size=G)
    assert "token-axis and stored pre-RoPE" in str(err.value) and "\n" not in str(err.value)


_PROBE = """
    import torch
    from sglang.srt.layers.rotary_embedding import get_rope
    from kvtuner.errors import KVTunerError
    from kvtuner.runtime_loader.sglang.pool.slot_rope import rotary_frequencies

    def model(*ropes):
        m = torch.nn.Module()
        m.layers = torch.nn.ModuleList(torch.nn.Module() for _ in ropes)
        for layer, rope in zip(m.layers, ropes):
            layer.rotary_emb = rope
        return m

    plain = get_rope(64, 64, 2048, 10000, True)
    llama3 = get_rope(64, 64, 4096, 500000, True, rope_scaling={"rope_type": "llama3",
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512})
    want = 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64)
    assert torch.allclose(rotary_frequencies(model(plain, plain)), want)
    assert torch.equal(rotary_frequencies(model(llama3)), llama3._compute_inv_freq(500000))
    yarn = get_rope(64, 64, 2048, 10000, True, rope_scaling={"rope_type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 512})
    cases = [model(get_rope(64, 64, 2048, 10000, False)), model(yarn), model(plain, llama3)]
    for case in cases:
        try:
            rotary_frequencies(case)
        except KVTunerError as exc:
            print("refused:", exc)
"""


def test_frequencies_come_from_sglangs_own_rotary_modules():
    """SGLang's RotaryEmbedding builds only on its CPU engine (an environment read at import),
    so this runs in a child process, as the server does."""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    path = [str(here / "sgl_kernel_standin"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_PROBE)], env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    refused = run.stdout.splitlines()
    assert len(refused) == 3, run.stdout
    assert "GPT" not in refused[0] and "RotaryEmbedding is not one" in refused[0]
    assert "YaRNScalingRotaryEmbedding is not one" in refused[1]
    assert "one shared rotary embedding in the model, found 2" in refused[2]
