"""Test-only launcher: the real ``sglang.launch_server`` with Gemma 3 kept on SGLang's separate
sliding-window pool (``SWAKVPool``), to drive the kvtuner sub-pools end to end.

SGLang 0.5.23 never builds SWAKVPool for Gemma 3 on its own: ``Gemma3ForCausalLM`` is not in
``configs/model_config.is_hybrid_swa_model``'s list (a model opts in with ``is_hybrid_swa`` and
``hybrid_layer_pattern`` in its config, :func:`swa_model_dir`), and the Gemma 2/3 model override
(``arg_groups/model_overrides/gemma2_gemma3.py``) sets ``disable_hybrid_swa_memory``, with no
flag to undo it. This launcher drops that one declaration (a hook on
``arg_groups.overrides.collect_model_override_declarations``, registered in every process that
imports this module, scheduler children included) and changes nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

TARGET = "sglang.srt.arg_groups.overrides.collect_model_override_declarations"


def keep_hybrid_swa(original: Any, *args: Any, **kwargs: Any) -> list:
    declared = original(*args, **kwargs)
    return [
        (src, {k: v for k, v in d.items() if k != "disable_hybrid_swa_memory"})
        for src, d in declared
    ]


def swa_model_dir(model_dir: Path, out: Path) -> Path:
    """``model_dir``'s files linked into ``out`` with a config that opts in to hybrid SWA
    (window layers from its ``layer_types``)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f)
    config = json.loads((model_dir / "config.json").read_text())
    config["is_hybrid_swa"] = True
    config["hybrid_layer_pattern"] = [int(t == "sliding_attention") for t in config["layer_types"]]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


HookRegistry.register(TARGET, keep_hybrid_swa, HookType.AROUND)

if __name__ == "__main__":
    import runpy

    runpy.run_module("sglang.launch_server", run_name="__main__")
