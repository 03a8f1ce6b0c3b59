"""No GPU here: the attention kernel (with and without a window and soft cap, over rows and
over a pool's channel-axis key pages; element-wise and scale-after-dot, bf16 and fp16 queries;
pre-RoPE keys, full and partial rotary width; a pool of planes) and its reduce (with sinks)
compile for an H100 (sm_90), the kernel with tensor-core dots."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

COMPILE = textwrap.dedent("""
    import inspect, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kvtuner.attention import kernel as dk, splits
    from kvtuner.quant import QuantSpec

    def ptx(k, v, paged, ragged=False, gemma=False, after=False, q="*bf16", rope=0,
            planes=False):
        consts = dict(D=128, GROUP=4, GP=4, BQ=1, BT=64, K_BITS=k.bits, K_G=k.group_size,
                      K_SYM=k.symmetric, K_CHANNEL=k.axis == "channel", V_BITS=v.bits,
                      V_G=v.group_size, V_SYM=v.symmetric, PAGED=paged, HAS_ROWS=paged,
                      HAS_START=not paged, RAGGED=ragged, WINDOW=gemma, SOFTCAP=gemma,
                      DOT_IEEE=False, K_AFTER_DOT=dk.takes_after_dot(k, after and not rope),
                      V_AFTER_DOT=dk.takes_after_dot(v, after), ROPE_HALF=rope,
                      K_PLANES=planes, V_PLANES=planes)
        ptrs = {"q_ptr": q, "k_ptr": "*u8", "v_ptr": "*u8", "kt_ptr": "*bf16",
                "vt_ptr": "*bf16", "ks_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32",
                "freq_ptr": "*fp32"}
        sig = {}
        for name in inspect.signature(dk._attention_kernel.fn).parameters:
            if name in consts:
                sig[name] = "constexpr"
            elif name in ptrs or name.endswith("_ptr"):
                sig[name] = ptrs.get(name, "*i32")
            else:
                sig[name] = "fp32" if name in ("score_scale", "cap_log2") else "i64"
        src = ASTSource(dk._attention_kernel, sig, consts)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]

    print("mma" in ptx(QuantSpec(4), QuantSpec(4), True))
    print("mma" in ptx(QuantSpec(4, axis="channel"), QuantSpec(3), False))
    print("mma" in ptx(QuantSpec(4), QuantSpec(8), True, ragged=True))  # SGLang's extend
    print("mma" in ptx(QuantSpec(4), QuantSpec(4), True, ragged=True, gemma=True))  # window, cap
    print("mma" in ptx(QuantSpec(4, axis="channel"), QuantSpec(4), True))  # the pool's KIVI pages
    print("mma" in ptx(QuantSpec(4), QuantSpec(4), True, after=True))  # scale after the dot
    print("mma" in ptx(QuantSpec(8), QuantSpec(3, symmetric=True), False, after=True, q="*fp16"))
    print("mma" in ptx(QuantSpec(2, axis="channel"), QuantSpec(6), True, after=True, gemma=True))
    print("mma" in ptx(QuantSpec(4, axis="channel"), QuantSpec(4), False, rope=64))  # pre-RoPE
    print("mma" in ptx(QuantSpec(4), QuantSpec(4), False, after=True, q="*fp16", rope=16))
    print("mma" in ptx(QuantSpec(4, 128), QuantSpec(8, 64), True, ragged=True, planes=True))
    sig = {"o_ptr": "*fp32", "lse_ptr": "*fp32", "sinks_ptr": "*fp32", "out_ptr": "*fp32",
           "num_splits": "i32", "hq": "i32", "D": "constexpr", "S_PAD": "constexpr",
           "HAS_SINKS": "constexpr"}
    src = ASTSource(splits._reduce_kernel, sig, dict(D=128, S_PAD=8, HAS_SINKS=True))
    print(".entry" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"])
""")


def test_attention_kernel_compiles_for_sm90_with_tensor_core_dots():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["True"] * 12
