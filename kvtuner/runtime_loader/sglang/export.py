"""Export a GGUF checkpoint to the plain HF folder SGLang serves (SGLang cannot load our GGUF).

transformers dequantizes the GGUF on load; ``save_pretrained`` refuses such a model ("quantized
with gguf and is not serializable") until the GGUF quantizer marks are dropped — the weights in
memory are already plain tensors.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ...errors import KVTunerError

__all__ = ["export_gguf_to_hf"]


def export_gguf_to_hf(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "bfloat16"
) -> Path:
    """Write model + tokenizer of ``gguf_path`` to ``out_dir`` (atomic: temp folder + rename).

    Returns ``out_dir``; an existing folder with a ``config.json`` is reused as is.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    if not gguf_path.is_file():
        raise KVTunerError(f"GGUF file not found: {gguf_path}")
    import torch
    import transformers

    kw = {"gguf_file": gguf_path.name}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, dtype=getattr(torch, dtype), **kw
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model.hf_quantizer = None  # weights are dequantized already; let save_pretrained run
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
