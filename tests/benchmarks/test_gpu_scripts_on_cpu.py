"""The GPU benchmarks run end to end on CPU (Triton's interpreter, tiny shapes; timings
meaningless), so a script error shows here and not first on a lent GPU, where the SGLang step's
``hardware()`` call once failed after all its timings were taken."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
TINY_MODEL = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
              "--hidden", "128", "--intermediate", "256", "--vocab", "128"]  # fmt: skip
CASES = {
    "attention_decode": ["--batch", "2", "--context", "48", "--heads", "4", "--kv-heads", "2",
                         "--head-dim", "32", "--specs", "KV4 g32", "--max-registers", "none",
                         "168"],
    "sglang_backend_step": ["--smoke"],
    "hf_decode": ["--batch", "1", "--context", "24", "--new-tokens", "3", "--caches", "dynamic",
                  "KV4 g32", "KV4 g32 static", *TINY_MODEL],
}  # fmt: skip


@pytest.mark.parametrize("script", list(CASES))
def test_script_runs_and_writes_its_json(script, tmp_path):
    out = tmp_path / f"{script}.json"
    cmd = [sys.executable, str(BENCH / f"{script}.py"), "--device", "cpu", *CASES[script]]
    res = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True,
                         timeout=600, cwd=BENCH)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["hardware"]["device"] == "cpu"
    assert result["command"].startswith(f"python benchmarks/{script}.py --device cpu")
    assert result.get("results") or result.get("rows")
    if script == "hf_decode":  # every new token after the first stamped: 3 tokens, 2 steps
        assert [r["steps_timed"] for r in result["results"]] == [2, 2, 2], result["results"]


def test_graphs_need_a_gpu_and_say_so_in_one_line(tmp_path):
    cmd = [sys.executable, str(BENCH / "attention_decode.py"), "--device", "cpu", "--graphs",
           "--output", str(tmp_path / "x.json")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=BENCH)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --graphs times CUDA-graph replays: it needs --device cuda"
    ]
    assert not (tmp_path / "x.json").exists()


def test_pool_plan_sweep_times_every_plan_of_every_spec(tmp_path, monkeypatch):
    """``quant_throughput.py --plans`` (the GPU session's pack/unpack sweep): one row per plan
    and spec, each naming its plan."""
    monkeypatch.syspath_prepend(str(BENCH))
    from quant_throughput import PLAN_SPECS, POOL_PLANS

    out = tmp_path / "plans.json"
    cmd = [sys.executable, str(BENCH / "quant_throughput.py"), "--kernels", "--plans",
           "--shape", "8", "1", "64", "--output", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=BENCH)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["spec"], r["plan"]) for r in rows] == [
        (spec.short(), plan) for spec in PLAN_SPECS for plan in POOL_PLANS
    ]
    assert all(r["pack_us"] > 0 and r["unpack_us"] > 0 for r in rows)


def test_decode_sized_rows_time_a_writes_k_and_v_both_ways(tmp_path):
    """``quant_throughput.py --kernels`` at a decode size: each row also times a write's K and
    V in one launch and a launch a side (on CPU eagerly; a GPU replays them in CUDA graphs)."""
    out = tmp_path / "kernels.json"  # head_dim 128: the specs include g128
    cmd = [sys.executable, str(BENCH / "quant_throughput.py"), "--kernels", "--shape", "8", "1",
           "128", "--output", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=BENCH)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert rows and all(r["pack_kv_us"] > 0 and r["pack_sides_us"] > 0 for r in rows)
    assert {r["timing"] for r in rows} == {"eager"}


def test_a_head_dim_the_groups_do_not_divide_is_one_line(tmp_path):
    cmd = [sys.executable, str(BENCH / "quant_throughput.py"), "--kernels", "--shape", "8", "1",
           "64", "--output", str(tmp_path / "x.json")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=BENCH)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --shape 8 1 64: groups of 4b/g128/asym/token do not divide head_dim"
    ]
    assert not (tmp_path / "x.json").exists()


def test_pool_layouts_are_timed_in_one_run_and_checked(tmp_path):
    """``--layouts rows padded planes``: each spec's pool as rows, padded to 16 bytes and as
    planes, in one run, each against the reference (KV4 g128 at head_dim 32: 20-byte rows, 32
    apart padded)."""
    out = tmp_path / "layouts.json"
    cmd = [sys.executable, str(BENCH / "attention_decode.py"), "--device", "cpu", "--batch", "2",
           "--context", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--specs",
           "KV4 g128", "--variants", "decode-kernel", "--layouts", "rows", "padded", "planes",
           "--output", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=BENCH)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["layout"], r["row_strides"]) for r in result["results"]] == [
        ("rows", [20, 20]),
        ("padded", [32, 32]),
        ("planes", [20, 20]),
    ]
    errors = result["check_max_abs_err"]["KV4 g128"]
    assert set(errors) == {"decode-kernel", "decode-kernel padded", "decode-kernel planes"}
    assert max(float(e) for e in errors.values()) < 1e-2, errors
    assert "KV4 g128 (padded: 32/32 B rows)" in res.stdout and "KV4 g128 (planes)" in res.stdout
