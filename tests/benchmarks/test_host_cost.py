"""``benchmarks/host_cost.py``: an eager step's host time of a fused attention call, measured
with the kernels built for sm_90a and never run. Holds what it can prove on any machine: every
call is timed, a decode or extend call makes two Triton launches (the kernel and its merge), no
more, and a layer's K+V write one. Needs the shared ``sm90_report.py`` beside the checkout, as
CI has it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
TOOL = Path(__file__).resolve().parents[3] / "shared" / "tools" / "sm90_report.py"


def test_each_eager_call_is_timed_and_launches_the_kernels_it_needs_only(tmp_path):
    if not TOOL.is_file():
        pytest.skip(f"{TOOL} (the shared sm90_report tool) is not beside this checkout")
    out = tmp_path / "host.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # built, not run
    cmd = [sys.executable, str(BENCH / "host_cost.py"), "--calls", "3", "--output", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=BENCH)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    labels = {"HF decode KV4 g32", "SGLang extend KV4 g32", "write K+V KV4 g32, one launch"}
    assert {r["label"] for r in rows} >= labels
    for r in rows:
        assert r["launches_per_call"] == (1 if r["label"].endswith("one launch") else 2), r
        assert 0 < r["triton_us_per_call"] < r["us_per_call"], r


def test_bad_calls_get_one_line_and_exit_2():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(BENCH / "host_cost.py"), "--calls", "0"],
                         capture_output=True, text=True, cwd=BENCH, env=env)  # fmt: skip
    assert res.returncode == 2 and "--calls" in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0, res.stderr
