"""load_token_batches: embedded default, local text/jsonl/parquet/folders via datasets, errors."""

from __future__ import annotations

import json

import pytest
import torch
from calib_helpers import byte_tokenizer

from kvtuner import KVTunerError
from kvtuner.calibration import load_calibration_data, load_token_batches
from kvtuner.calibration.batches import _taken_spans, _windows, special_prefix
from kvtuner.calibration.corpus import EMBEDDED_FILE, EMBEDDED_NAME
from kvtuner.evaluation import load_eval_windows

TEXT = "The quick brown fox jumps over the lazy dog. " * 40  # 1800 bytes = 1800 byte tokens


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def test_embedded_default_is_deterministic_given_the_seed(tok):
    a = load_calibration_data(tok, num_samples=3, seq_len=64, seed=7)
    b = load_token_batches(tok, num_samples=3, seq_len=64, seed=7)
    c = load_token_batches(tok, num_samples=3, seq_len=64, seed=8)
    assert a.tokens.dtype == torch.long and a.tokens.shape == (3, 64)
    assert torch.equal(a.tokens, b) and not torch.equal(a.tokens, c)
    assert a.describe() == {
        "dataset": EMBEDDED_NAME,
        "split": "validation",
        "num_samples": 3,
        "seq_len": 64,
        "seed": 7,
        "tokens": 192,
    }


def test_offset_draws_windows_disjoint_from_the_first_draw(tok):
    first = load_token_batches(tok, num_samples=3, seq_len=64, seed=7)
    more = load_calibration_data(tok, num_samples=4, seq_len=64, seed=7, offset=3).tokens
    both = load_token_batches(tok, num_samples=7, seq_len=64, seed=7)
    assert torch.equal(both, torch.cat([first, more]))  # the same permutation, continued
    assert not any(torch.equal(a, b) for a in first for b in more)


def test_disjoint_from_skips_every_window_sharing_a_token_with_the_first_draw(tok):
    first = load_calibration_data(tok, num_samples=3, seq_len=64, seed=7)
    same = load_calibration_data(tok, num_samples=4, seq_len=64, seed=7, disjoint_from=first)
    continued = load_calibration_data(tok, num_samples=4, seq_len=64, seed=7, offset=3)
    assert torch.equal(same.tokens, continued.tokens)  # same length: the permutation, continued
    ids = torch.arange(10_000)  # each token its own position: overlap is a shared id
    taken = _taken_spans(ids.numel(), first, prefix_len=0)
    assert [b - a for a, b in taken] == [64] * 3
    longer = _windows(ids, 80, 100, seed=7, taken=taken)
    used = {i for a, b in taken for i in range(a, b)}
    assert longer.shape == (80, 100) and not used & set(longer.flatten().tolist())
    assert used & set(_windows(ids, 80, 100, seed=7).flatten().tolist())  # without: it overlaps


def test_windows_lead_with_the_tokenizers_bos_and_keep_their_length():
    bos_tok = byte_tokenizer(bos=True)
    assert special_prefix(bos_tok) == (256,) and special_prefix(byte_tokenizer()) == ()
    data = load_calibration_data(bos_tok, num_samples=3, seq_len=64, seed=7)
    plain = load_token_batches(byte_tokenizer(), num_samples=3, seq_len=63, seed=7)
    assert data.tokens.shape == (3, 64) and bool((data.tokens[:, 0] == 256).all())
    assert torch.equal(data.tokens[:, 1:], plain)  # the same text windows, one token shorter
    assert data.describe()["prefix_ids"] == [256]
    windows = load_eval_windows(bos_tok, dataset=str(EMBEDDED_FILE), num_windows=2, seq_len=32)
    body = load_eval_windows(
        byte_tokenizer(), dataset=str(EMBEDDED_FILE), num_windows=2, seq_len=31
    )
    assert torch.equal(windows.tokens[:, 1:], body.tokens) and bool(
        (windows.tokens[:, 0] == 256).all()
    )


def test_embedded_windows_are_real_wikitext(tok):
    tokens = load_token_batches(tok, num_samples=2, seq_len=128, seed=0)
    text = EMBEDDED_FILE.read_text()
    for row in tokens:
        assert tok.decode(row) in text


def test_embedded_slice_is_attributed():
    attribution = (EMBEDDED_FILE.parent / "ATTRIBUTION.md").read_text()
    assert "CC BY-SA 3.0" in attribution and "WikiText-2" in attribution


def _write(tmp_path, kind):
    if kind == "txt":
        (tmp_path / "a.txt").write_text(TEXT)
        return tmp_path / "a.txt"
    rows = [{"text": TEXT[:900], "id": 1}, {"text": TEXT[900:], "id": 2}]
    if kind == "jsonl":
        (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        return tmp_path / "a.jsonl"
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "a.parquet"))
    return tmp_path / "a.parquet"


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_read_through_datasets(tmp_path, tok, kind):
    path = _write(tmp_path, kind)
    data = load_calibration_data(tok, dataset=str(path), num_samples=4, seq_len=100, seed=0)
    assert data.split == "train" and data.dataset == str(path.resolve())
    joined = TEXT if kind == "txt" else TEXT[:900] + "\n\n" + TEXT[900:]  # rows = documents
    for row in data.tokens:
        assert tok.decode(row) in joined


def test_folder_of_text_files(tmp_path, tok):
    for i in range(3):
        (tmp_path / f"part{i}.txt").write_text(TEXT)
    tokens = load_token_batches(tok, dataset=str(tmp_path), num_samples=10, seq_len=500, seed=1)
    assert tokens.shape == (10, 500)


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("/no/such/file.txt", "dataset not found"),
        ("hf:wikitext", "expected hf:NAME:CONFIG:SPLIT"),
    ],
)
def test_bad_datasets_fail_in_one_line(tok, dataset, message):
    with pytest.raises(KVTunerError, match=message):
        load_token_batches(tok, dataset=dataset, num_samples=1, seq_len=8)


def test_hub_dataset_offline_fails_fast(tok, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(KVTunerError, match="HF_DATASETS_OFFLINE is set; pass a local file"):
        load_token_batches(
            tok, dataset="hf:wikitext:wikitext-2-raw-v1:validation", num_samples=1, seq_len=8
        )


def test_too_little_text_and_bad_sizes(tmp_path, tok):
    (tmp_path / "t.txt").write_text("short text")
    with pytest.raises(KVTunerError, match="too few for 2 sample\\(s\\) of 8 tokens"):
        load_token_batches(tok, dataset=str(tmp_path / "t.txt"), num_samples=2, seq_len=8)
    with pytest.raises(KVTunerError, match="seq_len must be a positive integer"):
        load_token_batches(tok, num_samples=1, seq_len=0)


def test_mixed_folder_and_no_text_column(tmp_path, tok):
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": TEXT}))
    with pytest.raises(KVTunerError, match="mixes file kinds"):
        load_token_batches(tok, dataset=str(tmp_path), num_samples=1, seq_len=8)
    (tmp_path / "c.jsonl").write_text(json.dumps({"a": 1, "b": 2}))
    with pytest.raises(KVTunerError, match="no 'text' column"):
        load_token_batches(tok, dataset=str(tmp_path / "c.jsonl"), num_samples=1, seq_len=8)
