"""SGLang tier: collected only where sglang is installed (the sglang venv), never imported by
the core venv's ``pytest -m "not sglang"``. Every test here carries ``@pytest.mark.sglang``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("sglang") else ["test_*.py"]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # sglang_server helper


@pytest.fixture(scope="session")
def tiny_profile():
    """Builder: Profile over len(specs) LLaMA-shaped layers; specs = [(k_spec, v_spec), ...]."""
    from kvtuner.profile import LayerSpec, ModelFingerprint, Profile

    def build(specs, *, heads: int = 2, head_dim: int = 64):
        fp = ModelFingerprint("LlamaForCausalLM", len(specs), heads, head_dim)
        layers = tuple(LayerSpec(i, k, v) for i, (k, v) in enumerate(specs))
        return Profile("tiny", fp, layers)

    return build


@pytest.fixture(scope="session")
def smollm2_dir():
    from sglang_server import smollm2_hf_dir

    return smollm2_hf_dir()
