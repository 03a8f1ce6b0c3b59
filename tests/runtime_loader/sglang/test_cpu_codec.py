"""PairCodec (numpy) against the torch reference: the same bytes and the same values, bit for bit.
(No sglang needed: the codec is numpy + the reference.)"""

from __future__ import annotations

import itertools

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.runtime_loader.sglang.pool.cpu_writes.cpu_codec import PairCodec

HEADS, D = 3, 64
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PAIRS = [  # (k, v): shared grids of equal and of different widths, and grids that differ
    (QuantSpec(4, 64, rotation="hadamard"), QuantSpec(4, 64)),
    (QuantSpec(8, rotation="hadamard"), QuantSpec(8)),
    (QuantSpec(4, rotation="hadamard"), QuantSpec(2)),
    (QuantSpec(5, rotation="hadamard"), QuantSpec(3)),
    (QuantSpec(3, 64, rotation="hadamard"), QuantSpec(2, 64)),
    (QuantSpec(6, 16), QuantSpec(5, 16, rotation="hadamard")),
    (QuantSpec(2, symmetric=True, rotation="hadamard"), QuantSpec(3, symmetric=True)),
    (QuantSpec(8, 8, symmetric=True), QuantSpec(4, 8, symmetric=True)),
    (QuantSpec(4, 32), QuantSpec(4, 64)),  # different group sizes: two grid passes
    (QuantSpec(5, 32, rotation="hadamard"), QuantSpec(2, 32, symmetric=True)),
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def assert_same_as_reference(k, v, k_spec, v_spec, dtype):
    k_rows, v_rows, k_hat, v_hat = PairCodec(k_spec, v_spec, k.shape[1]).encode(k, v, dtype)
    for x, spec, rows, hat in ((k, k_spec, k_rows, k_hat), (v, v_spec, v_rows, v_hat)):
        ref_rows = quantize(x, spec)
        assert torch.equal(torch.from_numpy(rows), ref_rows)
        ref = dequantize(ref_rows, spec, x.shape[-1], dtype)
        assert hat.dtype == dtype and hat.shape == ref.shape
        nan = ref.isnan()  # poisoned groups: NaN in both
        assert torch.equal(hat.isnan(), nan)
        assert torch.equal(_bits(hat[~nan]), _bits(ref[~nan]))  # bit for bit
    rows_only = PairCodec(k_spec, v_spec, k.shape[1]).encode(k, v)
    assert torch.equal(torch.from_numpy(rows_only[0]), torch.from_numpy(k_rows))
    assert rows_only[2] is None and rows_only[3] is None


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].short()}+{p[1].short()}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 8, 37])
def test_random_tokens(pair, dtype, n):
    g = torch.Generator().manual_seed(n)
    k, v = ((torch.randn(n, HEADS, D, generator=g) * 3).to(dtype) for _ in range(2))
    assert_same_as_reference(k, v, *pair, dtype)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].short()}+{p[1].short()}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_finite_constant_signed_zero_and_tiny_groups(pair, dtype):
    g = torch.Generator().manual_seed(7)
    k, v = (torch.randn(9, HEADS, D, generator=g) * 5 for _ in range(2))
    for x in (k, v):
        x[0, 1, 3], x[1, 0, 40], x[1, 2, 9], x[2, 2, 60] = float("nan"), float("inf"), -7e4, 7e4
        x[3] = 2.5  # constant groups
        x[4, :, ::2], x[4, :, 1::2] = -0.0, 0.0
        x[4, 0] = -0.0  # an all -0 head: stored metadata must be +0
        x[5, 0] = torch.randn(D, generator=g) * 1e-6  # fp16 subnormal range
        x[5, 1] = 3e-8
        x[6, 0, 7] = -float("inf")
        x[7, 1] = torch.linspace(-60000, 60000, D)
        x[8, 2] = 1e5 if dtype != torch.float16 else 65000  # beyond fp16 (symmetric: poisoned)
    assert_same_as_reference(k.to(dtype), v.to(dtype), *pair, dtype)


def test_unsupported_specs_are_refused():
    assert not PairCodec.supports(QuantSpec(16), QuantSpec(4))
    assert not PairCodec.supports(QuantSpec(4, axis="channel"), QuantSpec(4))
    with pytest.raises(ValueError, match="token-axis"):
        PairCodec(QuantSpec(4), QuantSpec(16), HEADS)


_ELEMS = st.floats(-1000, 1000, width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("pair", PAIRS[2:8], ids=lambda p: f"{p[0].short()}+{p[1].short()}")
@settings(max_examples=25, deadline=None)
@given(
    data=hnp.arrays(
        np.float32, st.tuples(st.integers(1, 4), st.just(2), st.just(D)), elements=_ELEMS
    )
)
def test_hypothesis_rows(pair, data):
    x = torch.from_numpy(data)
    for dtype in DTYPES:
        for k, v in itertools.permutations((x, x.flip(0)), 2):
            assert_same_as_reference(k.to(dtype), v.to(dtype), *pair, dtype)
