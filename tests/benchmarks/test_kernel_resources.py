"""The GPU-free loop (``benchmarks/kernel_resources.py``): every decode and extend kernel (pre-RoPE
and KIVI keys' decode included) and every pack/unpack kernel compiles for an H100 (sm_90a, Triton's
ptxas) and holds what a fast kernel shows there, read off its build without a GPU: no spill, no
code loaded (or, packing, stored) a byte at a time; decode tiles of 4-8 warps at most 168 registers
a thread (3 programs an SM) and tiles of one warp at least 8 warps an SM (on an H200 KV4 g32 ran
1.7× faster on 32 tokens × 1 warp, 245 registers, 8 programs an SM, than on 64 × 4 warps, 154
registers, 3 an SM); pack and unpack at least 8 warps an SM, unpack 48 and no layout change through
shared memory, and few instructions a row. The extend kernel's tiles are MMA tiles of 64-128 query
rows: 232-246 registers and 1-2 programs an SM ran 3-4× faster on an H200 than 16 rows at 128
(docs/results/gpu.md), so extend is held to no spill in its loop only (KIVI's extend tile, at 128
registers and 4 programs an SM, keeps one value across the loop in local memory: a store before it
and a load after). The decode launcher's register cap, fitted at a build's first launch, is run
here as a GPU runs it (the builds it tried and the one it took). The decode kernels are built
a second time by the GPU machines' Triton (3.6, whose builds differ from CI's 3.9), where
``KVTUNER_TRITON_GPU_PYTHON`` names a Python that has it (``scripts/test.sh`` installs one). A
regression fails here, in CI, before any GPU is lent.

Needs the shared ``sm90_report.py`` beside the checkout (``../shared/tools``), as CI has it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
TOOL = Path(__file__).resolve().parents[3] / "shared" / "tools" / "sm90_report.py"
# a Python whose Triton is the GPU machines' (3.6): scripts/test.sh installs it beside the CPU
# torch and names it here
GPU_TRITON_PYTHON = os.environ.get("KVTUNER_TRITON_GPU_PYTHON", "")
GPU_TRITON = "3.6"
MAX_REGISTERS = 168  # 3 programs of 4 warps an SM (65,536 registers)
MIN_WARPS = 8  # an SM's warps where a program is one warp: its latency hidden across programs


def fits(row: dict) -> bool:
    """A decode tile's registers: 4-8 warps at most MAX_REGISTERS, one warp MIN_WARPS an SM."""
    if row["num_warps"] >= 4:
        return row["reg"] <= MAX_REGISTERS
    return row["warps_per_sm"] >= MIN_WARPS


def built(python: str, groups: list[str], out: Path) -> dict:
    """``kernel_resources.py --only groups`` run by ``python`` (its Triton builds): the JSON."""
    if not TOOL.is_file():
        pytest.skip(f"{TOOL} (the shared sm90_report tool) is not beside this checkout")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not run
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH.parent), env.get("PYTHONPATH")]))
    cmd = [python, str(BENCH / "kernel_resources.py"), "--only", *groups, "--output", str(out)]
    # the limit only stops a hang: see the fixtures
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=BENCH)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def decode_rows(tmp_path_factory) -> list[dict]:
    """CI's Triton (torch 2.13's). About 170 s of compiling on 2 idle cores with a fresh
    Triton cache; 634 s in a CI rehearsal beside the other tiers."""
    out = tmp_path_factory.mktemp("resources") / "decode.json"
    return built(sys.executable, ["decode", "fitted", "extend", "pack"], out)["rows"]


@pytest.fixture(scope="module")
def gpu_triton_rows(tmp_path_factory) -> list[dict]:
    """The decode kernels as the GPU machines' Triton builds them (50 s of compiling on this
    CPU with a fresh cache)."""
    if not Path(GPU_TRITON_PYTHON).is_file():
        pytest.skip("KVTUNER_TRITON_GPU_PYTHON names no Python (scripts/test.sh installs one)")
    out = tmp_path_factory.mktemp("resources") / "decode_gpu_triton.json"
    result = built(GPU_TRITON_PYTHON, ["decode", "fitted"], out)
    assert result["triton"].startswith(GPU_TRITON + "."), result["triton"]
    return result["rows"]


def launched(row: dict) -> bool:
    """Not a build the decode launcher tried and left (``fitted`` rows: a cap, or none)."""
    return row.get("fitted_cap", row.get("maxnreg")) == row.get("maxnreg")


def within_instructions_a_key(rows: list[dict], limits: dict) -> None:
    """Each decode build of ``limits``' labels issues at most its limit of loop instructions a
    key (launched builds only, where a label was built at several register caps)."""
    decode = {r["label"]: r for r in rows if r["kernel"] == "_decode_kernel" and launched(r)}
    for label, limit in limits.items():
        assert 0 < decode[label]["token_sass"] <= limit, (label, decode[label]["token_sass"])


def holds_the_limits(row: dict) -> None:
    """A decode or extend row: nothing spilled in its loop, no byte loads; decode also at most
    8 spilled bytes outside it, registers that fit (:func:`fits`) and no path taken per
    lane inside a tile (a loop's branches: its back edge, and a 4-warp tile's two cross-warp
    reductions). The 8 bytes: ptxas, at the 168 it keeps one-warp tiles to, may store a
    value once before the loop and load it once after (K8V4 under Triton 3.9 since int32 row
    offsets: a shared-memory swizzle of the epilogue); 104 bytes spilled in the loop ran at
    0.80× on the H200."""
    where = f"{row['label']}: {row['reg']} registers, {row['spill_bytes']} B spilled"
    assert row["loop_local"] == 0, where
    widths = {**row["ldg_widths"], **row["ldgsts_widths"]}
    assert "U8" not in widths, f"{row['label']} loads bytes one at a time: {widths}"
    if row["kernel"] == "_decode_kernel":
        assert row["spill_bytes"] <= 8 and fits(row), where
        assert row["loop_branches"] <= 3, (row["label"], row["loop_branches"])


def test_decode_and_extend_kernels_fit_the_registers_without_spill_or_byte_loads(decode_rows):
    decode = [r for r in decode_rows if r["kernel"] == "_decode_kernel" and launched(r)]
    extend = [r for r in decode_rows if r["kernel"] == "_extend_kernel"]
    assert len(decode) >= 9 and len(extend) >= 2  # every spec, the window, the HF path
    for row in decode + extend:
        holds_the_limits(row)


def test_the_gpu_machines_triton_builds_decode_within_the_same_limits(gpu_triton_rows):
    """Every decode build as the GPU machines' Triton (3.6) makes it holds the limits CI's
    does. Its builds differ: 3.6 rejected a construct 3.9 takes (``NG == RG == 2``), which
    failed every decode launch there; and it built pre-RoPE keys' [BT, 1] scale loads as a
    branch around each 4-byte copy, 61 branches and 1740 instructions a 16-key tile (then 1 and
    1206, 75.4 a key; 46.0 since a tile's keys turn by a table, 32 keys a tile: held to 50);
    and a row's offset in int64 with about twice the address instructions 3.9 takes (KV8 g64
    29.1 -> 26.5 a key in int32; KV4 g128 31.2 -> 26.6). Keys in the key lane order of its
    4-wide MMA operand and 2/4-bit keys read in place in their byte: KV8 g64 26.5 -> 25.3 a key
    (held to 26.5), K8V4 27.6 -> 26.3 (27.5), KV4 g128 26.6 -> 26.2 (27), KV4 g32 26.1 -> 25.1
    (26); 4-bit value rows paired by a PTX ``prmt``: KV4 g32 24.6; pre-RoPE rotary tiles in
    channel pairs: KV4 g32 pre-RoPE 44.6 -> 42.4 (held to 44); 3-bit keys in key lane order:
    KV3 g32 39.5 -> 36.4 (held to 38)."""
    decode = [r for r in gpu_triton_rows if r["kernel"] == "_decode_kernel" and launched(r)]
    assert len(decode) >= 30, len(decode)
    for row in decode:
        holds_the_limits(row)
    within_instructions_a_key(decode, {
        "decode KV4 g32 pre-RoPE": 44, "decode KV8 g64": 26.5, "decode KV4 g128": 27,
        "decode K8V4 g64/g32": 27.5, "decode KV4 g32": 26, "decode KV3 g32": 38,
    })  # fmt: skip


def test_pre_rope_and_kivi_keys_run_the_specialised_kernels_within_the_same_limits(decode_rows):
    """Pre-RoPE keys (full and partial rotary widths) and KIVI pages (pre-RoPE or not; and at
    extend): the specialised kernels, not the general one, and the limits above (the loop
    there covers them; this pins the rows)."""
    labels = {"decode KV4 g32 pre-RoPE", "decode KV4 g32 pre-RoPE R=D/4", "decode KV8 g64 pre-RoPE",
              "decode KV3 g32 pre-RoPE", "decode KIVI K4 g32 V4 g32",
              "decode KIVI K4 g32 V4 g32 pre-RoPE", "decode KIVI K3 g32 V3 g32 pre-RoPE",
              "extend KIVI K4 g32 V4 g32, new tokens in hand"}  # fmt: skip
    rows = [r for r in decode_rows if r["label"] in labels and r["kernel"] != "_reduce_kernel"]
    assert {r["label"] for r in rows} == labels
    for row in rows:
        assert row["kernel"] in ("_decode_kernel", "_extend_kernel"), row["label"]
        holds_the_limits(row)


def test_keys_rotated_over_the_whole_row_take_its_scales_in_one_copy(decode_rows):
    """Pre-RoPE keys rotated over the whole row read the row's scales and zeros once, then
    split them between the rotary halves: not each half its own, in 2-byte loads where a half
    is one group (KV8 g64: 64 a tile, 96.4 loop instructions a key under Triton 3.9, against
    none and 80.6). Under Triton 3.6, the GPU machines', each half's [BT, 1] words had built a
    branch around every 4-byte copy: one-warp KV4 g32 1740 -> 1206 loop instructions a tile,
    168 -> 136 registers (docs/results/gpu.md)."""
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    row = decode["decode KV8 g64 pre-RoPE"]
    assert "U16" not in row["ldg_widths"], row["ldg_widths"]
    assert 0 < row["token_sass"] <= 85, row["token_sass"]


def test_keys_rotated_over_the_whole_row_take_a_tiles_cos_and_sin_once(decode_rows):
    """Pre-RoPE keys rotated over the whole row turn by i·f_j past the tile's first key, read
    from a table, and q turns back by that key's position once a tile: a tile's cos and sin
    are its q's, not each key's (sm_90a, 16-key tiles: 72 ``MUFU`` a program, 64 of them a
    tile's cos and sin, against 24 now)."""
    labels = ("decode KV4 g32 pre-RoPE", "decode KV8 g64 pre-RoPE", "decode KV8 g32 pre-RoPE",
              "decode KV3 g32 pre-RoPE")  # fmt: skip
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    for label in labels:
        assert decode[label]["sass"]["mufu"] <= 32, (label, decode[label]["sass"])


def test_rotary_tiles_keep_each_halfs_channel_pairs_in_one_register(decode_rows):
    """One-warp pre-RoPE keys of 4/8-bit token rows rotated over the whole row: each rotary
    half's channels j and j + 1, one register, stay side by side in the tile the MMA takes, so
    no register is split and re-paired (``packed_rows.rotary_pairs``; loop instructions a key,
    before: KV4 g32 41.8, its ``PRMT`` 221 a tile, KV8 g32 45.0, KV8 g64 61.5)."""
    within_instructions_a_key(decode_rows, {
        "decode KV4 g32 pre-RoPE": 38, "decode KV8 g32 pre-RoPE": 42, "decode KV8 g64 pre-RoPE": 55,
    })  # fmt: skip


def test_keys_of_two_planes_are_read_in_key_lane_order(decode_rows):
    """3/5/6-bit keys (a low and a high plane) in key lane order on one warp: a lane's quarter
    of the row is whole words of both planes, each shift a constant (loop instructions a key,
    before: KV3 g32 38.3, KV6 g32 40.2, K5V3 40.1)."""
    within_instructions_a_key(decode_rows, {
        "decode KV3 g32": 36.5, "decode KV6 g32": 37, "decode K5V3 g64/g32 (had keys)": 37,
    })  # fmt: skip


def test_rows_of_16_byte_multiples_load_codes_16_bytes_at_a_time(decode_rows):
    """KV4 g32's 80-byte rows: the codes come in 16-byte async copies, on one warp (the plan
    since the H200 sweep of 2026-11-26), 8 programs an SM."""
    (row,) = (r for r in decode_rows if r["label"] == "decode KV4 g32" and "decode" in r["kernel"])
    assert row["ldgsts_widths"].get("128", 0) > 0
    assert row["num_warps"] == 1 and row["programs_per_sm"] >= MIN_WARPS


def test_rows_padded_to_16_bytes_load_their_codes_16_bytes_at_a_time(decode_rows):
    """Rows whose width is no multiple of 16 (KV4 g128 68 B, KV8 g64 136, symmetric KV4 g32
    72) are read in 4- and 8-byte copies as packed; padded to 16 bytes, in 16-byte copies (32
    of 68, 66 of 74 and 16 of 42 a tile in the build), still without spill: what
    ``attention_decode.py --row-align 0 16`` times before a pool format aligns codes without
    the padding's bytes."""
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    for label in ("KV4 g128", "KV8 g64", "KV4 g32 sym"):
        packed, padded = decode[f"decode {label}"], decode[f"decode {label} rows padded to 16 B"]
        assert "128" not in packed["ldgsts_widths"], (label, packed["ldgsts_widths"])
        assert padded["ldgsts_widths"].get("128", 0) >= 16, (label, padded["ldgsts_widths"])
        assert padded["spill_bytes"] == 0, label


def test_planes_load_and_store_codes_16_bytes_at_a_time(decode_rows):
    """The same rows as planes (a slot's codes of every head, then their scales: not a byte
    more): decode copies the codes as the padded rows do, pack stores them 16 bytes at a time
    (KV4 g128 rows: 17 stores of 4 bytes a row; planes: 4 of 16 and one of 4). Unpack reads a
    chunk of 8 codes a thread whatever the rows (test below)."""
    by_label = {r["label"]: r for r in decode_rows if r["kernel"] != "_reduce_kernel"}
    for label in ("KV4 g128", "KV8 g64", "KV4 g32 sym"):
        row = by_label[f"decode {label} planes"]
        assert row["ldgsts_widths"].get("128", 0) >= 16 and row["spill_bytes"] == 0, row
    for label in ("KV4 g128", "KV8 g64"):
        rows, planes = by_label[f"pack {label}"], by_label[f"pack {label} planes"]
        assert "128" not in rows["stg_widths"] and planes["stg_widths"].get("128", 0) >= 4, label


def test_one_scale_a_token_head_in_planes_decodes_within_128_registers(decode_rows):
    """Issue 43's aim for the per-token-head format: <= 128 registers and 16-byte code copies.
    Keys dotted first and the value codes in lane order took its one-warp tile from 255
    registers and 8 programs an SM to 122 and 16 (sm_90a)."""
    row = next(r for r in decode_rows if r["label"] == "decode KV4 g128 planes")
    assert row["reg"] <= 128 and row["spill_bytes"] == 0, row
    assert row["ldgsts_widths"].get("128", 0) >= 16, row["ldgsts_widths"]


def test_decode_value_tiles_reach_the_dot_without_a_layout_change(decode_rows):
    """The value tile in the MMA's lane order (``value_lanes``): no staging of the dequantized
    tile through shared memory, so a thread moves at most 1000 bytes through it a 32-key tile
    (456-880 in the build; KV4 g32 at most 800: 696, and 1424 when the tile changed layout
    there) and the one-warp tile holds at least 10 programs an SM (KV4 g32: 245 registers and 8
    before, 182 and 11 now)."""
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    for label in ("decode KV4 g32", "decode KV8 g64", "decode K8V4 g64/g32", "decode KV2 g32"):
        row = decode[label]
        assert row["loop_shared_bytes"] <= 1000, (label, row["loop_shared_bytes"])
        assert row["programs_per_sm"] >= 10, (label, row["programs_per_sm"])
    assert decode["decode KV4 g32"]["loop_shared_bytes"] <= 800


def test_decode_metadata_comes_in_async_copies_and_a_tile_costs_few_instructions(decode_rows):
    """Scales and zeros load as int32 words, so Triton's pipeline copies them ahead with the
    codes: no 2-byte load left in the loop of KV8 g64 (136-byte rows) or one scale a
    token-head (68-byte rows), where it waited on memory every tile. And KV4 g32 costs at most
    40 instructions a key (a 64-key tile on 4 warps: 70 when every scale and zero was masked
    per element, 47.7 since; 32 keys on one warp: 37.2)."""
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    for label in ("decode KV4 g32", "decode KV8 g64", "decode KV4 g128", "decode K8V4 g64/g32"):
        assert "U16" not in decode[label]["ldg_widths"], (label, decode[label]["ldg_widths"])
    assert 0 < decode["decode KV4 g32"]["token_sass"] <= 40, decode["decode KV4 g32"]["token_sass"]


def test_value_tiles_pair_tokens_and_keys_read_whole_words_on_one_warp(decode_rows):
    """4-bit value tiles are built two tokens a register, as the value MMA pairs them (no
    ``PRMT`` re-pairing a token's two channels), element-wise ones dequantized by
    ``fma.rn.f16x2`` on those pairs; 2/4/8-bit keys dequantized element-wise are read in key
    lane order (whole words a lane, constant shifts); byte codes dotted as 1024 + c take their
    mask and exponent in one PTX ``lop3``, and so do codes dequantized element-wise on those
    pairs, their 1024 off in one PTX ``sub.f16x2``. Loop instructions a key, Triton 3.9: KV4
    g64 27.9 -> 25.4 (held at 27), KV4 g32 sym 36.4 -> 26.4 (held at 31), K8V4 32.9 -> 25.8
    (held at 30), KV8 g64 26.6 -> 23.9 (held at 25), KV4 g32 26.6 -> 25.2 (held at 26), KV8
    g32 30.5 -> 27.5 (held at 29); KV4 g32's shared-memory bytes a tile 664 -> 456 (held at
    560). 2/4-bit keys read in place in their byte (one shift a word), then 4-bit value rows
    paired by a PTX ``prmt`` a word: KV4 g32 24.7 -> 23.7 -> 23.2 (held at 24), KV4 g32 sym
    26.1 -> 25.2 -> 24.7 (held at 26.5), KV4 g64 25.1 -> 24.6 (held at 25.5)."""
    decode = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    limits = {"decode KV4 g64": 25.5, "decode KV4 g32 sym": 26.5, "decode K8V4 g64/g32": 30,
              "decode KV8 g64": 25, "decode KV4 g32": 24, "decode KV8 g32": 29}  # fmt: skip
    for label, limit in limits.items():
        assert 0 < decode[label]["token_sass"] <= limit, (label, decode[label]["token_sass"])
    assert decode["decode KV4 g32"]["loop_shared_bytes"] <= 560


def test_the_launcher_caps_registers_where_the_build_then_spills_nothing(decode_rows):
    """On a GPU the decode plan's cap on registers is fitted at a build's first launch: the
    lowest of ``REGISTER_CAPS`` whose build spills nothing and holds more programs an SM than
    the uncapped build, else none (one-warp KV4 g32, sm_90a: 162 registers and 12 programs
    uncapped, 16 bytes spilled at 128, none at 144 and 14 programs, under Triton 3.9; under
    3.6 none spilled at 128: 16 programs against 13). KV8 g64 in planes, SGLang's layout for
    its 136-byte rows, spills at 128 and 144 and fits 152 (3.9: 13 programs against 9). The
    HF cache's pre-RoPE decode (64 keys on 4 warps, built only here): 223 registers and 2
    programs an SM uncapped under 3.9, none spilled at 168 and 3."""
    fitted: dict[str, list[dict]] = {}
    for row in decode_rows:
        if row["label"].endswith(" fitted") and row["kernel"] == "_decode_kernel":
            fitted.setdefault(row["label"], []).append(row)
    assert len(fitted) == 7, sorted(fitted)
    uncapped = {r["label"]: r for r in decode_rows if r["kernel"] == "_decode_kernel"}
    for label, rows in fitted.items():
        own = [r for r in rows if r["maxnreg"] is None]  # where the decode group has none
        base = uncapped.get(label.removesuffix(" fitted")) or own[0]
        cap = rows[0]["fitted_cap"]
        for row in rows:
            if row["maxnreg"] is not None and (cap is None or row["maxnreg"] < cap):
                assert row["spill_bytes"] or row["programs_per_sm"] <= base["programs_per_sm"]
        if cap is not None:
            (took,) = (r for r in rows if r["maxnreg"] == cap)
            assert took["spill_bytes"] == 0, (label, took)
            assert took["programs_per_sm"] > base["programs_per_sm"], (label, took, base)
    assert fitted["decode KV4 g32 fitted"][0]["fitted_cap"] in (128, 144)
    assert fitted["decode KV8 g64 planes fitted"][0]["fitted_cap"] is not None


def test_the_general_kernel_is_still_the_slow_one_it_replaces(decode_rows):
    """The comparison row keeps the proxy honest: it must show the known bad build."""
    (row,) = (r for r in decode_rows if r["label"] == "decode KV4 g32 general kernel"
              and r["kernel"] == "_attention_kernel")  # fmt: skip
    assert row["spill_bytes"] > 0 or row["reg"] > MAX_REGISTERS


def test_unpack_reads_a_chunk_a_thread_and_changes_no_layout(decode_rows):
    """Unpack of 2-8-bit rows, rows or planes, stores 8 values a thread 16 bytes at a time, two
    whole rows a warp's store; each thread reads its own chunk of 8 codes (3-bit codes: its low
    plane's, and the high plane's word) and its group's scale and zero, so nothing goes through
    shared memory. Reading a row's codes 16 bytes a thread, the KV4 g32 build changed layout
    there twice (5 shared loads, 3 stores, 3 barriers a program), and on the H200 a warp waited
    28 of every 88 cycles on that queue (Nsight Compute, docs/results/gpu.md)."""
    by_label = {r["label"]: r for r in decode_rows}
    for label in ("KV4 g32", "KV8 g64", "KV4 g128", "KV3 g32", "KV8 g64 planes",
                  "KV4 g128 planes"):  # fmt: skip
        row = by_label[f"unpack {label}"]
        moved = {k: row["sass"][k] for k in ("lds", "sts", "bar")}
        assert row["shared"] == 0 and not any(moved.values()), (label, row["shared"], moved)
        assert set(row["stg_widths"]) == {"128"}, (label, row["stg_widths"])


def test_a_decode_sized_pack_runs_shorter_programs(decode_rows):
    """At decode sizes a pack takes one program's time: the launcher's plan for 16 tokens
    (:meth:`PoolPlan.filling`, 8 rows a program) issues under half the instructions a program
    of 32 rows does (Triton 3.9, one warp: KV4 g32 and KV8 g64 about 3x fewer)."""
    by_label = {r["label"]: r for r in decode_rows}
    for label in ("KV4 g32", "KV8 g64"):
        full, decode = by_label[f"pack {label}"], by_label[f"pack {label} at decode (16 tokens)"]
        program = {}
        for name, row in (("full", full), ("decode", decode)):
            program[name] = sum(row["sass"].values()) * row["num_warps"]
        assert decode["constexprs"]["BLOCK"] == 8, decode["constexprs"]
        assert 0 < 2 * program["decode"] < program["full"], (label, program)


def test_pack_and_unpack_move_rows_in_words_at_every_row_length(decode_rows):
    """80-byte KV4 g32, 136-byte KV8 g64 (offsets multiples of 8 bytes), 3-bit codes in two
    planes and 16-bit rows: no byte-wide load or store, no spill, and at least 8 warps an SM
    (KV4 g32 pack took 140 registers at 64 rows a program; KV8 g64 255 and 1064 B spilled, with
    68 byte stores). Unpack of plain rows waits on memory: at least 48 warps an SM (on the H200,
    52-64 ran at 0.42-0.48× clone(), 13 on one warp at 0.20-0.31×, though they issued a quarter
    fewer instructions a row; codes read a chunk a thread and converted by I2F took 40-48
    registers under Triton 3.9, 40 warps at 3 bits; read as fp32 2^23 + q, 32). Instructions a
    row: pack did 107 (KV4 g32) and 112 (KV8 g64) on 4 warps, a group reduced across four
    threads, 53 on one warp; Hadamard unpack, a whole row a thread, 61 (172 with a row over
    eight threads); Hadamard pack, a whole row a thread with its rows copied ahead 16 bytes at a
    time, 89 (606 with a row over eight threads, its butterflies through shuffles and shared
    memory)."""
    rows = [r for r in decode_rows if r["label"].startswith(("pack ", "unpack "))]
    assert {r["label"] for r in rows} >= {"pack KV8 g64", "unpack KV3 g32", "pack K16"}
    for row in rows:
        where = f"{row['label']}: {row['reg']} registers, {row['spill_bytes']} B spilled"
        assert row["spill_bytes"] == 0, where
        assert row["warps_per_sm"] >= 8, where
        moves = {**row["ldg_widths"], **row["stg_widths"]}
        assert "U8" not in moves, f"{row['label']} moves bytes one at a time: {moves}"
        if row["label"].startswith("unpack ") and "hadamard" not in row["label"]:
            assert row["warps_per_sm"] >= 48, where
    (kv4,) = (r for r in rows if r["label"] == "pack KV4 g32")
    assert kv4["stg_widths"].get("128", 0) > 0 and kv4["programs_per_sm"] >= 6
    per_row = {r["label"]: r["row_sass"] for r in rows}
    assert per_row["pack KV4 g32"] <= 60 and per_row["pack KV8 g64"] <= 60, per_row
    assert per_row["unpack KV4 g32 hadamard"] <= 70, per_row
    assert per_row["pack KV4 g32 hadamard"] <= 100, per_row
    (had,) = (r for r in rows if r["label"] == "pack KV4 g32 hadamard")
    assert set(had["ldgsts_widths"]) <= {"128", "64"} and had["ldgsts_widths"].get("128"), had
