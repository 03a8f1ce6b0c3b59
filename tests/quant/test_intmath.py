"""The host integer helpers give what Triton's constexpr functions of the same names give."""

from __future__ import annotations

import triton

from kvtuner.quant.intmath import cdiv, next_power_of_2


def test_cdiv_and_next_power_of_2_match_triton():
    for n in range(1, 4100):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 256):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
    assert cdiv(0, 7) == 0 and next_power_of_2(0) == 1
