"""vLLM serving SmolLM2 with a vLLM profile agrees with the HF cache emulating the same profile,
teacher-forced (the SGLang KIVI server test's protocol); and the fp8 engine recipe of the same
layers, whose vLLM flags are the profile's, agrees with its own emulation (calibrated per-layer
scales, which vLLM reads from a checkpoint; served here with flags, at 1.0) on the same tokens.

vLLM's fp8 KV attention needs a CPU with AVX-512 or AMX (or a GPU): skipped, reason shown, on
other CPUs. The thresholds are the SGLang test's; measured on an AVX-512 EPYC, where vLLM's CPU
kernel rounds fp8 toward zero and the emulation to nearest: 56 steps, largest deficit 0.5, the
same choice on 52.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvtuner.runtime_loader.hf import cache_kwargs

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from test_engine import PROFILE, run_engine, smollm2_dir  # noqa: E402

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves."]
NEW_TOKENS = 48
CLOSE_LOGIT = 1.0  # HF's top logit minus its logit of the served token, every step
SAME_CHOICE = 0.9  # share of steps where vLLM picks HF's argmax


def _cpu_runs_vllm_fp8() -> bool:
    return torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()


@pytest.mark.skipif(not _cpu_runs_vllm_fp8(), reason="vLLM's CPU fp8 KV needs AVX-512 or AMX")
def test_served_tokens_agree_with_hf_emulation(tmp_path):
    import transformers

    from kvtuner.profile import load_vllm_profile

    model_dir = smollm2_dir()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       return_dict=True)["input_ids"] for p in PROMPTS]  # fmt: skip
    ids_path = tmp_path / "ids.json"
    ids_path.write_text(json.dumps(prompts))
    served = run_engine(str(model_dir), str(PROFILE), str(ids_path), timeout=900)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    plan = load_vllm_profile(PROFILE).plan
    for emulated in (plan, _fp8_recipe(model, plan, prompts)):
        deficits = _deficits(model, emulated, prompts, served)
        assert max(deficits) <= CLOSE_LOGIT
        assert sum(d == 0 for d in deficits) >= SAME_CHOICE * len(deficits)


def _fp8_recipe(model, plan, prompts):
    """The engine recipe whose vLLM flags are ``plan``'s: fp8 except the skipped layers."""
    from kvtuner.calibration.kv_amax import kv_amax
    from kvtuner.quant.engine_recipe import EngineRecipe
    from kvtuner.runtime_loader.engines import recipe_vllm_args

    layers = tuple("auto" if i in plan.skip_layers else "fp8" for i in range(plan.num_layers))
    k_amax, v_amax = kv_amax(model, torch.tensor([prompts[0]]))
    recipe = EngineRecipe(layers, k_amax, v_amax)
    flags, needs_map = recipe_vllm_args(layers)
    plan_flags = plan.cli_args()
    plan_flags[1] = "fp8_e4m3" if plan_flags[1] == "fp8" else plan_flags[1]
    assert (flags, needs_map) == (plan_flags, False)
    return recipe


def _deficits(model, plan, prompts, served) -> list[float]:
    """Per served token: HF's top logit minus its logit of that token, with ``plan``'s cache."""
    from kvtuner.runtime_loader.hf.vllm_cache import make_vllm_cache

    deficits = []
    for ids, out in zip(prompts, served, strict=True):
        cache, x = make_vllm_cache(model, plan), torch.tensor([ids])
        with torch.no_grad():
            for token in out:
                logits = model(input_ids=x, **cache_kwargs(cache), use_cache=True).logits[0, -1]
                deficits.append(float(logits.max() - logits[token]))
                x = torch.tensor([[token]])
    return deficits
