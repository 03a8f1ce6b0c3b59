"""benchmarks/paired.py: per-window differences, rows joined from two runs on the same windows,
and one line with exit code 2 when the windows differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PAIRED = Path(__file__).parents[2] / "benchmarks" / "paired.py"
WINDOWS = {"dataset": "embedded:wikitext-2-test", "num_windows": 3, "seq_len": 11, "tokens": 33}


def _results(path: Path, rows: dict[str, list[float]], windows: dict = WINDOWS) -> Path:
    body = [{"name": n, "bytes_per_token": 100.0, "window_nll": nll} for n, nll in rows.items()]
    path.write_text(json.dumps({"data": windows, "rows": body}))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PAIRED), *args], capture_output=True, text=True)


def test_rows_of_a_second_run_pair_window_by_window(tmp_path):
    first = _results(tmp_path / "a.json", {"fp": [10.0, 20.0, 30.0], "x": [11.0, 21.0, 29.0]})
    second = _results(tmp_path / "b.json", {"y": [12.0, 20.0, 31.0]})
    out = tmp_path / "paired.json"
    res = _run(str(first), "x:y", "--also", str(second), "--out", str(out))
    assert res.returncode == 0, res.stderr
    (c,) = json.loads(out.read_text())["comparisons"]
    # x - y per window: -1, +1, -2 NLL over 10 predicted tokens
    assert c["mean_nats_per_token"] == round(-2 / 3 / 10, 5)
    assert c["a_better_windows"] == 2 and c["windows"] == 3


def test_a_run_on_other_windows_is_refused_in_one_line(tmp_path):
    first = _results(tmp_path / "a.json", {"x": [1.0, 2.0, 3.0]})
    other = _results(tmp_path / "b.json", {"y": [1.0, 2.0, 3.0]}, {**WINDOWS, "num_windows": 4})
    res = _run(str(first), "x:y", "--also", str(other))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"paired.py: {other} was measured on other windows"]
