"""Host integer helpers for launch grids and constexprs.

Triton's ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions: about 1.7 µs
a host call (their arguments are unwrapped as constexprs), against 0.02 µs here. An eager decode
step makes a handful a layer (``benchmarks/host_cost.py``)."""

from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1
