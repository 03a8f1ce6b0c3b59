"""QuantSpec validation and byte accounting."""

from __future__ import annotations

import pytest

from kvtuner.quant import QuantSpec


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(bits=7), "bits"),
        (dict(bits=1), "bits"),
        (dict(bits=True), "bits"),
        (dict(bits=4.0), "bits"),  # JSON 4.0 must not pass as 4 and fail later in bit shifts
        (dict(bits=4, group_size=24), "group_size"),
        (dict(bits=4, group_size=1), "group_size"),
        (dict(bits=4, group_size=32.0), "group_size"),
        (dict(bits=4, symmetric="yes"), "symmetric"),
        (dict(bits=4, axis="head"), "axis"),
        (dict(bits=4, rotation="random"), "rotation"),
        (dict(bits=4, pre_rope=1), "pre_rope"),
    ],
)
def test_invalid_fields_name_field_and_value(kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        QuantSpec(**kwargs)
    assert repr(kwargs[field]) in str(info.value)


@pytest.mark.parametrize(
    ("spec", "row_bytes", "effective_bits"),
    [
        (QuantSpec(2, 32), 16 + 2 * 4, 3.0),
        (QuantSpec(3, 32), 24 + 2 * 4, 4.0),
        (QuantSpec(4, 32), 32 + 2 * 4, 5.0),
        (QuantSpec(5, 64, symmetric=True), 40 + 2, 5.25),
        (QuantSpec(6, 32), 48 + 2 * 4, 7.0),
        (QuantSpec(4, 64, symmetric=True), 32 + 2, 4.25),
        (QuantSpec(8, 32), 64 + 2 * 4, 9.0),
        (QuantSpec(16), 128, 16.0),
    ],
)
def test_row_bytes_and_effective_bits(spec, row_bytes, effective_bits):
    assert spec.row_bytes(64) == row_bytes
    assert spec.effective_bits(64) == effective_bits


def test_channel_axis_block_bytes():
    spec = QuantSpec(4, 32, axis="channel")
    assert spec.block_bytes(64) == 32 * 32 + 64 * 4  # 32 code rows, then 64 scales and zeros
    assert spec.bytes_per_token(64) == spec.block_bytes(64) / 32
    assert spec.effective_bits(64) == 4.0 + 8 * 4 / 32
    with pytest.raises(ValueError, match="block_bytes"):
        spec.row_bytes(64)
    with pytest.raises(ValueError, match="block_bytes"):
        QuantSpec(4, 32).block_bytes(64)


@pytest.mark.parametrize(
    ("spec", "head_dim", "message"),
    [
        (QuantSpec(4, 32), 48, "does not divide head_dim"),
        (QuantSpec(4, 32), 60, "multiple of 8"),
        (QuantSpec(4, 16, rotation="hadamard"), 96, "power-of-two head_dim"),
    ],
)
def test_check_head_dim(spec, head_dim, message):
    with pytest.raises(ValueError, match=message):
        spec.row_bytes(head_dim)


def test_channel_group_need_not_divide_head_dim():
    assert QuantSpec(4, 64, axis="channel").block_bytes(32) == 32 * 64 // 2 + 32 * 4


def test_dict_round_trip_and_rejections():
    spec = QuantSpec(4, 64, True, "channel", "hadamard")
    assert QuantSpec.from_dict(spec.to_dict()) == spec
    assert QuantSpec.from_dict({"bits": 8}) == QuantSpec(8)
    assert "pre_rope" not in spec.to_dict()  # unset: older profiles keep their bytes and hash
    pre = QuantSpec(3, 32, axis="channel", pre_rope=True)
    assert pre.to_dict()["pre_rope"] is True and QuantSpec.from_dict(pre.to_dict()) == pre
    with pytest.raises(ValueError, match="unknown quant spec field"):
        QuantSpec.from_dict({"bits": 4, "nbits": 4})
    with pytest.raises(ValueError, match="missing 'bits'"):
        QuantSpec.from_dict({"group_size": 32})
    with pytest.raises(ValueError, match="must be an object"):
        QuantSpec.from_dict([4])


def test_short_labels():
    assert QuantSpec(16).short() == "16b"
    assert QuantSpec(4, 32).short() == "4b/g32/asym/token"
    assert QuantSpec(2, 64, True, rotation="hadamard").short() == "2b/g64/sym/token/had"
    assert QuantSpec(3, 32, axis="channel", pre_rope=True).short() == "3b/g32/asym/channel/prerope"
