"""The exported-profiles index is generated from the profiles, and rejects a broken one."""

import json

import pytest

from kvtuner import KVTunerError, ModelFingerprint, Profile, QuantSpec, save_profile
from kvtuner.profile.index import build_index, main

FP = ModelFingerprint("LlamaForCausalLM", num_layers=3, num_kv_heads=2, head_dim=64)


def profile(k, v, kl, axis="token", pre_rope=False):
    key = QuantSpec(k, 32, axis=axis, pre_rope=pre_rope)
    p = Profile.uniform("tiny", FP, key, QuantSpec(v, 32))
    return Profile(p.model_id, FP, p.layers, metrics={"kl": kl}).with_accounting(
        asked=f"{(k + v) / 2:g}bit", preset="kivi" if axis == "channel" else "per-token"
    )


def test_index_lists_every_profile_with_budget_and_quality(tmp_path):
    save_profile(profile(4, 4, 0.01), tmp_path / "tiny" / "per-token-4bit.json")
    save_profile(profile(4, 2, 0.05, axis="channel"), tmp_path / "tiny" / "kivi-3bit.json")
    pre = profile(3, 3, 0.04, axis="channel", pre_rope=True)
    save_profile(pre, tmp_path / "tiny" / "kivi-prerope-3bit.json")
    save_profile(profile(3, 3, 0.06, pre_rope=True), tmp_path / "tiny" / "token-prerope.json")
    assert main([str(tmp_path)]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    assert index == build_index(tmp_path)  # regenerating is stable and skips index.json
    entries = index["models"]["tiny"]["profiles"]
    names = ["tiny/per-token-4bit.json", "tiny/kivi-3bit.json", "tiny/kivi-prerope-3bit.json"]
    names.append("tiny/token-prerope.json")
    assert sorted(e["file"] for e in entries) == sorted(names)
    servable = {e["file"]: (e["sglang_servable"], e["sglang_page_size"]) for e in entries}
    assert servable[names[0]] == (True, None) and servable[names[1]] == (True, 32)  # KIVI pages
    assert servable[names[2]] == (True, 32)  # pre-RoPE KIVI keys: the pool turns them
    assert not servable[names[3]][0]  # pre-RoPE keys per token: the pool does not serve them
    assert entries[0]["kl"] == 0.01 and entries[0]["nominal_bits"] == 4.0
    md = (tmp_path / "index.md").read_text()
    assert "[tiny/kivi-3bit.json](tiny/kivi-3bit.json) | kivi | 3bit | 3.000" in md
    assert "| yes (--page-size 32) |" in md


def test_broken_profile_is_one_line_error(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(KVTunerError):
        build_index(tmp_path)
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
