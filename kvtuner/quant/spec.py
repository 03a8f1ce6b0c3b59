"""QuantSpec: how one tensor (a layer's K or V) is stored, and what that costs in bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

QUANTIZED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_BITS = (*QUANTIZED_BITS, 16)
V1_BITS = (2, 4, 8, 16)  # what profile schema v1 (and kvtuner < 0.2) can hold
AXES = ("token", "channel")
ROTATIONS = ("none", "hadamard")
SCALE_BYTES = 2  # scales and zeros are fp16


@dataclass(frozen=True)
class QuantSpec:
    """Storage of one K or V tensor.

    bits: 2, 3, 4, 5, 6, 8, or 16 (16 = stored unquantized as fp16 bytes). Codes of 3, 5 and 6
        bits need profile schema v2.
    group_size: elements sharing one scale (and zero). For axis "token" the groups run along
        head_dim inside one token-head; for axis "channel" (KIVI-style keys) they run along
        ``group_size`` consecutive tokens of one channel.
    symmetric: absmax grid (scale only) instead of min/max grid (scale and zero).
    axis: "token" (the only axis a paged pool can quantize at write time) or "channel".
    rotation: "hadamard" rotates each head_dim vector by an orthonormal Hadamard matrix before
        quantizing (undone on dequantize); spreads outlier channels over the whole group.
    pre_rope: keys only (profile schema v4; the SGLang pool serves it channel-axis only). The
        runtime rotates each key back to position 0 with the model's rotary frequencies before
        quantizing and forward again on read (exact: a rotation), so a channel keeps one scale
        along the tokens instead of swinging with the position (KVQuant's pre-RoPE keys; pays
        for channel-axis keys).
    """

    bits: int
    group_size: int = 32
    symmetric: bool = False
    axis: str = "token"
    rotation: str = "none"
    pre_rope: bool = False

    def __post_init__(self) -> None:
        if type(self.bits) is not int or self.bits not in SUPPORTED_BITS:  # 4.0 == 4: reject floats
            raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {self.bits!r}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise ValueError(f"group_size must be an int, got {self.group_size!r}")
        if self.group_size < 2 or self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size must be a power of two >= 2, got {self.group_size}")
        if not isinstance(self.symmetric, bool):
            raise ValueError(f"symmetric must be a bool, got {self.symmetric!r}")
        if self.axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {self.axis!r}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {self.rotation!r}")
        if not isinstance(self.pre_rope, bool):
            raise ValueError(f"pre_rope must be a bool, got {self.pre_rope!r}")

    @property
    def is_quantized(self) -> bool:
        return self.bits < 16

    @property
    def qmax(self) -> int:
        """Largest code; symmetric grids use codes 0..2*half with half = 2^(bits-1) - 1."""
        return (1 << self.bits) - 1

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim <= 0 or head_dim % 8:
            raise ValueError(f"head_dim must be a positive multiple of 8, got {head_dim}")
        if self.axis == "token" and self.is_quantized and head_dim % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide head_dim {head_dim}")
        if self.rotation == "hadamard" and head_dim & (head_dim - 1):
            raise ValueError(f"hadamard rotation needs a power-of-two head_dim, got {head_dim}")

    @property
    def _metadata_per_group(self) -> int:
        return SCALE_BYTES * (1 if self.symmetric else 2)

    def code_bytes(self, head_dim: int) -> int:
        return head_dim * self.bits // 8

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one packed token-head row (token axis): codes, scales, zeros."""
        self.check_head_dim(head_dim)
        if not self.is_quantized:
            return head_dim * 2
        if self.axis == "channel":
            raise ValueError("channel-axis specs pack blocks of tokens; use block_bytes()")
        groups = head_dim // self.group_size
        return self.code_bytes(head_dim) + groups * self._metadata_per_group

    def block_bytes(self, head_dim: int) -> int:
        """Bytes of one packed channel-axis block: group_size tokens of one head."""
        self.check_head_dim(head_dim)
        if self.axis != "channel" or not self.is_quantized:
            raise ValueError("block_bytes() is for quantized channel-axis specs")
        return self.code_bytes(head_dim) * self.group_size + head_dim * self._metadata_per_group

    def exact_bytes_per_token(self, head_dim: int) -> Fraction:
        """Bytes one token-head costs, metadata included (amortized over a channel block);
        exact, so budget arithmetic never rounds."""
        if self.axis == "channel" and self.is_quantized:
            return Fraction(self.block_bytes(head_dim), self.group_size)
        return Fraction(self.row_bytes(head_dim))

    def bytes_per_token(self, head_dim: int) -> float:
        return float(self.exact_bytes_per_token(head_dim))

    def effective_bits(self, head_dim: int) -> float:
        """Bits per element including scales and zeros."""
        return 8.0 * self.bytes_per_token(head_dim) / head_dim

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``pre_rope`` only when set (so older profiles keep their bytes and hash)."""
        out = asdict(self)
        if not self.pre_rope:
            del out["pre_rope"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantSpec:
        if not isinstance(data, dict):
            raise ValueError(f"a quant spec must be an object, got {type(data).__name__}")
        unknown = set(data) - {"bits", "group_size", "symmetric", "axis", "rotation", "pre_rope"}
        if unknown:
            raise ValueError(f"unknown quant spec field(s): {', '.join(sorted(unknown))}")
        if "bits" not in data:
            raise ValueError("quant spec is missing 'bits'")
        return cls(**data)

    def short(self) -> str:
        """Compact label, e.g. ``4b/g32/asym/token`` or ``16b``."""
        if not self.is_quantized:
            return "16b"
        sym = "sym" if self.symmetric else "asym"
        rot = "/had" if self.rotation == "hadamard" else ""
        rope = "/prerope" if self.pre_rope else ""
        return f"{self.bits}b/g{self.group_size}/{sym}/{self.axis}{rot}{rope}"
