"""The quality plot labels only the Pareto front and the named peers; reports re-load from JSON."""

from __future__ import annotations

import json

import pytest

from kvtuner.evaluation import EvalReport
from kvtuner.evaluation.plot import _labels, front_rows, plot_report
from kvtuner.profile import ModelFingerprint


def row(name: str, bits: float, delta: float, kind: str = "uniform") -> dict:
    return {"name": name, "kind": kind, "effective_bits": bits, "delta_ppl_pct": delta}


ROWS = [
    row("kv2", 3, 600),
    row("kivi2", 3, 78),
    row("p3", 4, 6, "profile"),
    row("kv3", 4, 28),
    row("kivi4", 5, 1.2),
    row("p4", 5, 1.2, "profile"),
    row("kv4", 5, 4.7),
    row("quanto4", 6, 4.8, "hf-quanto"),
    row("kv8", 9, 0.01),
]


def test_front_keeps_only_undominated_rows_and_ties():
    front = [r["name"] for r in front_rows(ROWS)]
    assert front == ["kivi2", "p3", "kivi4", "p4", "kv8"]


def test_labels_are_the_front_plus_named_peers_with_ties_merged():
    labels = _labels(front_rows(ROWS), ROWS)
    assert labels[(5, 1.2)] == ["kivi4", "p4"]  # one label, not two printed over each other
    assert labels[(6, 4.8)] == ["quanto4"]  # a named peer, off the front
    assert all(n not in sum(labels.values(), []) for n in ("kv2", "kv3", "kv4"))


def test_report_round_trips_through_its_json_and_replots(tmp_path):
    pytest.importorskip("matplotlib")
    fingerprint = ModelFingerprint("LlamaForCausalLM", 2, 2, 32)
    rows = [{**r, "ppl": 1.0} for r in ROWS] + [row("fp", 16, 0.0, "fp")]
    report = EvalReport("tiny", fingerprint, {"num_windows": 2, "seq_len": 8}, {}, rows, {}, 1.0)
    again = EvalReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()
    assert plot_report(again, tmp_path / "q.png").read_bytes()[:4] == b"\x89PNG"
