"""calibrate(): per-layer sensitivity equals the full-model measurement, is deterministic, and
is cached on disk (a re-run runs no forward pass; an interrupted run resumes)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from kvtuner import LayerSpec, QuantSpec
from kvtuner.calibration import CalibrationData, calibrate, fp_reference, measure_kl
from kvtuner.calibration.runner import decoder_layers
from kvtuner.calibration.sweep import PER_TOKEN_VALUE, layer_forwards

FP16 = QuantSpec(16)


def data(n=3, t=64, seed=0):
    tokens = torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))
    return CalibrationData("test", "train", n, t, seed, tokens)


def only(model, layer, part, spec):
    n = model.config.num_hidden_layers
    one = [FP16, FP16]
    one["kv".index(part)] = spec
    return [LayerSpec(i, *(one if i == layer else (FP16, FP16))) for i in range(n)]


class LayerForwards:
    """Counts decoder-layer forwards: calls, and rows run (the unit of sweep cost)."""

    def __init__(self, model):
        self.calls = self.rows = 0
        for m in decoder_layers(model):
            m.register_forward_pre_hook(self._hit, with_kwargs=True)

    def _hit(self, _module, args, kwargs):
        self.calls += 1
        self.rows += (args[0] if args else kwargs["hidden_states"]).shape[0]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_single_layer_kl_equals_the_full_model_measurement(family):
    model, d = tiny_model(family, num_hidden_layers=3), data()
    sens = calibrate(model, d, model_id="tiny", use_cache=False, progress=False)
    ref = fp_reference(model, d.tokens)
    for layer in range(3):
        for bits in (2, 3, 4):
            k = measure_kl(
                model,
                d.tokens,
                only(model, layer, "k", QuantSpec(bits, 32, rotation="hadamard")),
                ref,
            )
            v = measure_kl(model, d.tokens, only(model, layer, "v", QuantSpec(bits, 32)), ref)
            assert math.isclose(sens.kl(layer, "k", bits), max(k, 0.0), rel_tol=1e-6, abs_tol=1e-12)
            assert math.isclose(sens.kl(layer, "v", bits), max(v, 0.0), rel_tol=1e-6, abs_tol=1e-12)


def test_file_shape_and_orders():
    model = tiny_model("llama")
    sens = calibrate(model, data(), model_id="tiny", use_cache=False, progress=False)
    doc = sens.to_dict()
    assert doc["format"] == "kvtuner-sensitivity" and doc["version"] == 1
    assert doc["settings"] == {
        "bits": [2, 3, 4, 5, 8],
        "key_spec": {"group_size": 32, "symmetric": False, "axis": "token", "rotation": "hadamard"},
        "value_spec": {"group_size": 32, "symmetric": False, "axis": "token", "rotation": "none"},
    }
    assert doc["data"]["tokens"] == 192 and doc["fp"]["ppl"] > 1
    assert [e["layer"] for e in doc["layers"]] == [0, 1]
    for layer in range(2):
        for part in "kv":
            errs = [sens.attn_rel_err(layer, part, b) for b in (2, 3, 4, 5, 8)]
            assert errs == sorted(errs, reverse=True) and errs[-1] > 0
            assert sens.kl(layer, part, 2) > sens.kl(layer, part, 8)
            assert sens.kl(layer, part, 16) == 0.0


def test_deterministic():
    model = tiny_model("qwen2")
    a = calibrate(model, data(), model_id="t", use_cache=False, progress=False).to_dict()
    b = calibrate(model, data(), model_id="t", use_cache=False, progress=False).to_dict()
    assert a["layers"] == b["layers"] and a["fp"] == b["fp"]


def test_kivi_keys_and_symmetric_specs_run():
    model = tiny_model("llama")
    key = QuantSpec(4, 32, axis="channel")
    sens = calibrate(
        model,
        data(t=48),
        model_id="t",
        key_spec=key,
        value_spec=QuantSpec(4, 16, symmetric=True),
        bits=(2, 4),
        use_cache=False,
        progress=False,
    )
    assert sens.key_spec["axis"] == "channel" and sens.value_spec["symmetric"] is True
    assert sens.bits == (2, 4) and sens.kl(1, "k", 2) > 0


def test_cache_hit_runs_no_forward_and_resume_runs_only_missing_layers(tmp_path):
    model, d = tiny_model("llama", num_hidden_layers=3), data()
    counter = LayerForwards(model)
    first = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False)
    # fp pass: 3 layers, then each layer once more carrying fp activations up; layer l: 10
    # variants (K, V x 5 default widths) of layer l, then layers l+1.. once, batched 10x
    assert counter.rows == d.num_samples * layer_forwards(3, 5) == 3 * (6 + 10 * (3 + 2 + 1))
    assert counter.calls == 3 + 3 + (10 + 2) + (10 + 1) + 10
    counter.calls = counter.rows = 0
    again = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False)
    assert counter.calls == 0 and again.layers == first.layers
    for layer0 in tmp_path.glob("sensitivity/*/layer_0.json"):  # the K and the V half
        layer0.unlink()  # as if interrupted before layer 0 was written
    resumed = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False)
    assert counter.rows == d.num_samples * (3 + 1 + 10 * 3) and resumed.layers == first.layers


def test_a_preset_sharing_the_value_spec_measures_only_its_keys(tmp_path):
    model, d = tiny_model("llama", num_hidden_layers=3), data()
    plain = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False)
    counter = LayerForwards(model)
    kivi_keys = QuantSpec(4, 32, axis="channel")
    kivi = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False, key_spec=kivi_keys)
    # fp pass and carry-up as before; layer l: 5 key variants only, batched 5x downstream
    assert counter.rows == d.num_samples * (3 + 3 + 5 * (3 + 2 + 1))
    fresh = calibrate(model, d, model_id="t", use_cache=False, progress=False, key_spec=kivi_keys)
    assert kivi.layers == fresh.layers
    assert [e["v"] for e in kivi.layers] == [e["v"] for e in plain.layers]
    assert [e["k"] for e in kivi.layers] != [e["k"] for e in plain.layers]


def test_cache_key_covers_tokens_specs_and_weights(tmp_path):
    model = tiny_model("llama")
    calibrate(model, data(), model_id="t", cache_dir=tmp_path, progress=False)
    calibrate(model, data(seed=1), model_id="t", cache_dir=tmp_path, progress=False)
    calibrate(
        model, data(), model_id="t", cache_dir=tmp_path, progress=False, key_spec=PER_TOKEN_VALUE
    )
    calibrate(tiny_model("llama", seed=1), data(), model_id="t", cache_dir=tmp_path, progress=False)
    # a K half and a V half per run; the third run shares the first's V half
    assert len(list(tmp_path.glob("sensitivity/*"))) == 2 + 2 + 1 + 2


def test_eager_attention_and_row_chunks_give_the_same_numbers(monkeypatch):
    import transformers
    from conftest import tiny_config

    from kvtuner.calibration import kl

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config("llama"), attn_implementation="eager"
    ).eval()
    d = data()
    whole = calibrate(model, d, model_id="t", use_cache=False, progress=False)
    ref = fp_reference(model, d.tokens)
    v2 = measure_kl(model, d.tokens, only(model, 0, "v", QuantSpec(2, 32)), ref)
    assert math.isclose(whole.kl(0, "v", 2), v2, rel_tol=1e-6)
    monkeypatch.setattr(kl, "LOGITS_CHUNK_BYTES", 1)  # one sample per chunk
    chunked = calibrate(model, d, model_id="t", use_cache=False, progress=False)
    for layer in range(2):
        for part in "kv":
            for b in (2, 4, 8):
                a, c = whole.kl(layer, part, b), chunked.kl(layer, part, b)
                assert math.isclose(a, c, rel_tol=1e-4, abs_tol=1e-9)


def test_batch_size_chunks_the_windows_and_keeps_the_numbers():
    """--batch-size 1 vs 2 vs auto: forwards of 1 / 2 / 3 windows, the same sensitivities."""
    model, d = tiny_model("llama"), data()
    counter = LayerForwards(model)
    runs = {}
    for batch in (None, 2, 1):
        counter.calls = 0
        runs[batch] = calibrate(
            model, d, model_id="t", use_cache=False, progress=False, batch_size=batch
        )
        chunks = {None: 1, 2: 2, 1: 3}[batch]
        # per chunk: fp pass (2 layers) + carrying fp up (2) + 10 variants per layer + layer 1
        assert counter.calls == chunks * (2 + 2 + 10 + 1 + 10)
    for batch in (2, 1):
        for layer in range(2):
            for part in "kv":
                a, c = runs[None].kl(layer, part, 2), runs[batch].kl(layer, part, 2)
                assert math.isclose(a, c, rel_tol=1e-4, abs_tol=1e-9)


def test_sweep_holds_one_layer_of_fp_activations():
    """The fp activations walk up the layers: at any time one layer's inputs/attn/outputs."""
    from kvtuner.calibration.runner import advance_to, capture_fp

    model, d = tiny_model("llama", num_hidden_layers=3), data()
    fp = capture_fp(model, d.tokens, batch_size=2)
    assert fp.layer == 0 and len(fp.inputs) == len(fp.attn) == len(fp.outputs) == 2
    advance_to(model, fp, 2)
    assert fp.layer == 2 and fp.inputs[0].shape == (2, 64, 128)
    with pytest.raises(ValueError, match="cannot go back"):
        advance_to(model, fp, 1)


def test_bf16_model_records_its_dtype_and_device():
    model = tiny_model("llama").to(torch.bfloat16)
    sens = calibrate(model, data(n=1), model_id="t", bits=(2, 8), use_cache=False, progress=False)
    assert sens.data["dtype"] == "bfloat16" and sens.data["device"] == "cpu"
    assert sens.kl(0, "k", 2) > sens.kl(0, "k", 8) >= 0


def test_a_combined_cache_of_an_earlier_version_still_gives_its_halves(tmp_path):
    from kvtuner.calibration.models import fingerprint_of
    from kvtuner.calibration.sensitivity import spec_template
    from kvtuner.calibration.sweep import PER_TOKEN_KEY
    from kvtuner.calibration.sweep_cache import SweepCache, weights_digest

    model, d = tiny_model("llama", num_hidden_layers=3), data()
    plain = calibrate(model, d, model_id="t", use_cache=False, progress=False)
    legacy = SweepCache(
        tmp_path,
        {
            "fingerprint": fingerprint_of(model).to_dict(),
            "weights": weights_digest(model),
            "tokens": d.token_hash,
            "shape": list(d.tokens.shape),
            "bits": list(plain.bits),
            "key_spec": spec_template(PER_TOKEN_KEY),
            "value_spec": spec_template(PER_TOKEN_VALUE),
        },
    )
    legacy.put_fp_ppl(plain.fp_ppl)
    for entry in plain.layers:
        legacy.put_layer(entry["layer"], entry)
    counter = LayerForwards(model)
    again = calibrate(model, d, model_id="t", cache_dir=tmp_path, progress=False)
    assert counter.calls == 0 and again.layers == plain.layers
