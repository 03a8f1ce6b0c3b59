"""Where an eager decode step's host time goes (cProfile, 50 steps of KV4 g32 16 x 1024), as
run on the H200 on 2026-11-26 from the repo root (output in graph_probe.txt)."""

import cProfile
import pstats
import sys

import torch

sys.path.insert(0, "benchmarks")  # run from the repo root
from attention_decode import random_rows, specs_for  # noqa: E402

from kvtuner.attention import decode_attention  # noqa: E402
from kvtuner.runtime_loader.sglang.cuda.packed_metadata import PackedMetadata  # noqa: E402

k_spec, v_spec = specs_for("KV4 g32", 128)
B, T, hkv = 16, 1024, 8
table = torch.arange(B * T, dtype=torch.int32, device="cuda").view(B, T) + 1
rows = torch.arange(B, device="cuda")
seq = torch.full((B,), T, device="cuda")
kr, vr = (random_rows(B * T + 1, hkv, s, 128, "cuda") for s in (k_spec, v_spec))
q = torch.randn(B, 32, 128, device="cuda", dtype=torch.bfloat16)


def step():
    md = PackedMetadata.decode(seq, rows, table, hkv)
    return decode_attention(q, kr, vr, k_spec, v_spec, **md.kernel_args())


for _ in range(5):
    step()
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(50):
    step()
profile.disable()
torch.cuda.synchronize()
pstats.Stats(profile).sort_stats("tottime").print_stats(25)
