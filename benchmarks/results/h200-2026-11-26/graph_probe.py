"""Eager vs CUDA-graph decode steps (SGLang's metadata + decode_attention), as run on the H200
on 2026-11-26 from the repo root: ``python3 benchmarks/results/h200-2026-11-26/graph_probe.py``
(output in graph_probe.txt)."""

import sys

import torch
import triton.testing as tt

sys.path.insert(0, "benchmarks")  # run from the repo root
from attention_decode import random_rows, specs_for  # noqa: E402

from kvtuner.attention import decode_attention  # noqa: E402
from kvtuner.runtime_loader.sglang.cuda.packed_metadata import PackedMetadata  # noqa: E402

for label, B, T in (("KV4 g32", 16, 1024), ("KV4 g32", 16, 8192), ("KV8 g64", 16, 8192),
                    ("KV4 g32", 1, 8192)):  # fmt: skip
    k_spec, v_spec = specs_for(label, 128)
    hkv = 8
    table = torch.arange(B * T, dtype=torch.int32, device="cuda").view(B, T) + 1
    rows = torch.arange(B, device="cuda")
    seq = torch.full((B,), T, device="cuda")
    kr, vr = (random_rows(B * T + 1, hkv, s, 128, "cuda") for s in (k_spec, v_spec))
    q = torch.randn(B, 32, 128, device="cuda", dtype=torch.bfloat16)
    md = PackedMetadata.decode(seq, rows, table, hkv)

    def step(q=q, kr=kr, vr=vr, k_spec=k_spec, v_spec=v_spec, md=md):
        return decode_attention(q, kr, vr, k_spec, v_spec, **md.kernel_args())

    eager = tt.do_bench(step, warmup=25, rep=100)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    ref = step()
    g.replay()
    torch.cuda.synchronize()
    graph = tt.do_bench(g.replay, warmup=25, rep=100)
    diff = (out.float() - ref.float()).abs().max().item()
    print(f"{label} {B}x{T}: eager {eager * 1e3:.1f} us, graph replay {graph * 1e3:.1f} us, "
          f"max diff {diff:.2e}", flush=True)  # fmt: skip
