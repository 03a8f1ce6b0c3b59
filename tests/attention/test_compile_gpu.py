"""No GPU here: the attention kernel compiles for an H100 (sm_90) and uses tensor cores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

COMPILE = textwrap.dedent("""
    import inspect, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kvtuner.attention import decode as dk
    from kvtuner.quant import QuantSpec

    def ptx(k, v, paged, ragged=False):
        consts = dict(D=128, GROUP=4, GP=4, BQ=1, BT=64, K_BITS=k.bits, K_G=k.group_size,
                      K_SYM=k.symmetric, K_CHANNEL=k.axis == "channel", V_BITS=v.bits,
                      V_G=v.group_size, V_SYM=v.symmetric, PAGED=paged, HAS_ROWS=paged,
                      HAS_START=not paged, RAGGED=ragged, DOT_IEEE=False)
        ptrs = {"q_ptr": "*bf16", "k_ptr": "*u8", "v_ptr": "*u8", "kt_ptr": "*bf16",
                "vt_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32"}
        sig = {}
        for name in inspect.signature(dk._attention_kernel.fn).parameters:
            if name in consts:
                sig[name] = "constexpr"
            elif name in ptrs or name.endswith("_ptr"):
                sig[name] = ptrs.get(name, "*i32")
            else:
                sig[name] = "fp32" if name == "sm_scale_log2" else "i64"
        src = ASTSource(dk._attention_kernel, sig, consts)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]

    print("mma" in ptx(QuantSpec(4), QuantSpec(4), True))
    print("mma" in ptx(QuantSpec(4, axis="channel"), QuantSpec(3), False))
    print("mma" in ptx(QuantSpec(4), QuantSpec(8), True, ragged=True))  # SGLang's extend
""")


def test_attention_kernel_compiles_for_sm90_with_tensor_core_dots():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["True", "True", "True"]
