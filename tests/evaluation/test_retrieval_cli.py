"""`kvtuner eval --task ...` end to end on a tiny in-process model: table, JSON, resume, plots,
long-context perplexity, and one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvtuner.cli.main import main

sys.path.insert(0, str(Path(__file__).parent.parent / "calibration"))
from calib_helpers import save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-retrieval"))


def _argv(tiny_dir, tmp_path, *extra):
    return [
        "eval", "--model", str(tiny_dir), "--task", "passkey", "--context-length", "320", "400",
        "--depths", "0", "1", "--samples", "2", "--uniform", "kv4", "--residual-length", "16",
        "--pack-chunk", "8", "--results", str(tmp_path / "r.jsonl"), "--no-progress", *extra,
    ]  # fmt: skip


def test_retrieval_run_writes_table_json_and_resumes(tiny_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(_argv(tiny_dir, tmp_path, "--output", str(out))) == 0
    table = capsys.readouterr().out
    assert "task passkey" in table and "kv4" in table and "fp" in table
    report = json.loads(out.read_text())
    rows = {(r["config"], r["length"]): r for r in report["rows"]}
    assert set(rows) == {(c, n) for c in ("fp", "kv4") for n in (320, 400)}
    for r in rows.values():
        assert r["n"] == 4 and 0 <= r["ci95"][0] <= r["accuracy"] <= r["ci95"][1] <= 1
    assert rows[("kv4", 400)]["kv_bytes"] < rows[("fp", 400)]["kv_bytes"]
    assert rows[("fp", 400)]["kv_bytes"] == rows[("fp", 400)]["fp16_bytes"]
    assert {(c["config"], c["length"], c["depth"]) for c in report["cells"]} == {
        (c, n, d) for c in ("fp", "kv4") for n in (320, 400) for d in (0.0, 1.0)
    }
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 2 * 2 * 2 * 2  # header + configs x lengths x depths x samples
    # a rerun answers nothing again; a longer list of depths answers only the new ones
    assert main(_argv(tiny_dir, tmp_path, "--output", str(out))) == 0
    assert (tmp_path / "r.jsonl").read_text().splitlines() == lines
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert main(_argv(tiny_dir, tmp_path, "--depths", "0", "0.5", "1")) == 0
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == len(lines) + 8


def test_resume_refuses_a_file_of_other_settings(tiny_dir, tmp_path, capsys):
    assert main(_argv(tiny_dir, tmp_path, "--samples", "1")) == 0
    capsys.readouterr()
    assert main(_argv(tiny_dir, tmp_path, "--seed", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert "other settings (seed)" in err and "\n" not in err


def test_plots(tiny_dir, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "acc.png"
    assert main(_argv(tiny_dir, tmp_path, "--samples", "1", "--plot", str(plot))) == 0
    assert plot.stat().st_size > 0 and (tmp_path / "acc-depth.png").stat().st_size > 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--task", "vt"], "needs --context-length"),
        (["--task", "niah", "--context-length", "300", "--depths", "1.5"], "--depths"),
        (["--context-length", "100", "--score-tokens", "200"], "must exceed --score-tokens"),
        (["--context-length", "2048", "--kl"], "--kl scores whole windows"),
    ],
)
def test_bad_arguments_are_one_line(tiny_dir, capsys, extra, message):
    assert main(["eval", "--model", str(tiny_dir), "--uniform", "kv4", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_long_context_perplexity_scores_the_last_tokens(tiny_dir, tmp_path, capsys):
    out = tmp_path / "ppl.json"
    argv = ["eval", "--model", str(tiny_dir), "--uniform", "kv4", "--context-length", "300",
            "--score-tokens", "100", "--num-windows", "2", "--no-decode", "--hf-quanto", "off",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert (
        report["data"]["seq_len"] == 300 and report["settings"]["scored_tokens_per_window"] == 100
    )
    assert [r["name"] for r in report["rows"]] == ["fp", "kv4"]
    assert report["data"]["dataset"] == "embedded:wikitext-2-test"


def test_kl_adds_divergence_columns_to_the_perplexity_table(tiny_dir, tmp_path, capsys):
    out = tmp_path / "kl.json"
    argv = ["eval", "--model", str(tiny_dir), "--uniform", "kv2,kv16", "--seq-len", "64",
            "--num-windows", "2", "--no-decode", "--hf-quanto", "off", "--kl",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "KL vs fp" in capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["fp"]["kl"] == 0.0 and rows["fp"]["top1_agree"] == 1.0
    assert rows["kv2"]["kl"] > rows["kv16"]["kl"] >= 0.0
    assert rows["kv2"]["top1_agree"] <= rows["kv16"]["top1_agree"]
    assert len(rows["kv2"]["window_kl"]) == 2 and "dnll_fp_right" in rows["kv2"]
